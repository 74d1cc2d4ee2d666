package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// subject is one tool measured side by side with the others: how it starts
// an isolated environment that prints "hi", and how it runs `true` in an
// environment that is already running. A subject that cannot run on this
// host says why and is reported "not measured".
type subject struct {
	name string // as in the start table; ratios pair subjects by it
	// execName is its name in the exec table ("crun exec" for "crun run").
	execName string
	why      string // set: not measured, and why
	// once starts an isolated environment running `echo hi`, checks the
	// output and returns what is left to undo after the clock stops (nil:
	// nothing).
	once func(ctx context.Context) (undo func(), err error)
	// boot starts a long-running environment to exec into; nil when the tool
	// has none, with noExec saying so.
	boot   func(ctx context.Context) (*running, error)
	noExec string
}

// running is a long-running environment of a subject.
type running struct {
	exec func(ctx context.Context) error // runs true in it
	stop func()                          // removes it; never fails the run
	// d and id are berth's daemon and sandbox, for a berth subject.
	d  *daemon
	id string
}

// command runs a program and returns its stdout, failing with its stderr.
// Standard input is /dev/null and nothing of the program's outlives it on
// the pipes it was given (a detached container must be started with its
// output sent elsewhere).
func command(ctx context.Context, name string, args ...string) (string, error) {
	return commandEnv(ctx, nil, name, args...)
}

// commandEnv is command with env added to the process's environment.
func commandEnv(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, firstLine(stderr.String()+stdout.String()))
	}
	return stdout.String(), nil
}

// wantHi checks a subject's output of `echo hi`.
func wantHi(out string, err error) error {
	if err != nil {
		return err
	}
	if out != "hi\n" {
		return fmt.Errorf("output %q, want %q", out, "hi\n")
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// probe runs a subject's once a first time; a subject that fails it is
// not measured, with the failure as the reason.
func probe(ctx context.Context, s subject) subject {
	if s.why != "" {
		return s
	}
	undo, err := s.once(ctx)
	if undo != nil {
		undo()
	}
	if err != nil {
		return subject{name: s.name, execName: s.execName, why: "does not run here: " + firstLine(err.Error())}
	}
	return s
}
