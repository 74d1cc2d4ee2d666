package guest

import (
	"context"
	"log/slog"
	"os"
)

// Command runs `berth guest ARGS…` (or `berth-guest guest ARGS…`): the log
// goes to stderr (the runtime's guest log), at debug level when
// BERTH_GUEST_DEBUG is set. It returns only on failure.
func Command(args []string) error {
	level := slog.LevelInfo
	if os.Getenv("BERTH_GUEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return Main(context.Background(), args, log)
}
