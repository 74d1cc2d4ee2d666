package e2b

import (
	"github.com/berthsh/berth/api/e2b/envd/process/processconnect"
)

// processService is envd's process.Process over the manager's processes.
type processService struct {
	processconnect.UnimplementedProcessHandler
	g *Group
}

// processes keeps what envd knows of processes that berth does not: their
// tags.
type processes struct{}

func newProcesses() *processes { return &processes{} }
