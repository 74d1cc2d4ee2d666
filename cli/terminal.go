package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/berthsh/berth/client"
)

func shellCommand(connect connector) *cobra.Command {
	var user, workdir string
	var env []string
	cmd := &cobra.Command{
		Use:   "shell [flags] ID [-- CMD [ARG...]]",
		Short: "An interactive terminal in a sandbox: a login shell, or CMD (exits with its code)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash >= 0 && dash != 1 || dash < 0 && len(args) != 1 {
				return fmt.Errorf("usage: %s", cmd.UseLine())
			}
			envMap, err := parsePairs("--env", env)
			if err != nil {
				return err
			}
			c, err := connect()
			if err != nil {
				return err
			}
			return openTerminal(cmd, c, args[0], client.TerminalOptions{Cmd: args[1:], User: user, Cwd: workdir, Env: envMap})
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user (name or uid[:gid])")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable K=V (repeatable)")
	return cmd
}

func attachCommand(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "attach ID PID",
		Short: "Attach to a terminal or a process started with open stdin: its recent output first, then live",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("PID %q is not a number", args[1])
			}
			c, err := connect()
			if err != nil {
				return err
			}
			t, err := c.Attach(cmd.Context(), args[0], pid)
			if err != nil {
				return err
			}
			return runTerminal(cmd, t)
		},
	}
}

// openTerminal starts a terminal the size of the CLI's own and runs it.
func openTerminal(cmd *cobra.Command, c *client.Client, id string, o client.TerminalOptions) error {
	if fd := int(os.Stdin.Fd()); term.IsTerminal(fd) {
		if w, h, err := term.GetSize(fd); err == nil {
			o.Rows, o.Cols = h, w
		}
	}
	t, err := c.OpenTerminal(cmd.Context(), id, o)
	if err != nil {
		return err
	}
	return runTerminal(cmd, t)
}

// runTerminal connects the CLI's terminal to t until the process ends: raw
// mode (Ctrl-C and every key go to the process), the size on SIGWINCH,
// and the process's exit code as the CLI's. Closing the CLI's stdin (a
// pipe) closes the process's input. Detached by a lost connection, the
// process goes on: berth attach ID PID.
func runTerminal(cmd *cobra.Command, t *client.Terminal) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	stdin := int(os.Stdin.Fd())
	if term.IsTerminal(stdin) {
		old, err := term.MakeRaw(stdin)
		if err != nil {
			return fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(stdin, old)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-winch:
					if w, h, err := term.GetSize(stdin); err == nil {
						t.Resize(ctx, h, w)
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	// Input: a read of stdin cannot be interrupted, so this goroutine ends
	// with the CLI when the process ends first.
	go func() {
		if _, err := io.Copy(t, cmd.InOrStdin()); err == nil && ctx.Err() == nil {
			t.CloseStdin(ctx)
		}
	}()
	defer t.Close()
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	for {
		ev, err := t.Next(ctx)
		if err != nil {
			return fmt.Errorf("terminal of process %d: %w (it may still run: berth attach)", t.Pid, err)
		}
		switch {
		case ev.Stdout != nil:
			out.Write(ev.Stdout)
		case ev.Stderr != nil:
			errOut.Write(ev.Stderr)
		case ev.Error != nil:
			fmt.Fprintf(errOut, "\r\nberth: %s\r\n", ev.Error.Message)
		case ev.Exit != nil:
			code := ev.Exit.ExitCode
			if code == 0 && ev.Exit.Signal != 0 {
				code = 128 + ev.Exit.Signal
			}
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		}
	}
}
