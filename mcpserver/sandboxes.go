package mcpserver

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthsh/berth/api"
)

// sandboxID is the argument every per-sandbox tool takes.
const sandboxIDDoc = "The sandbox's id, as get_or_create_sandbox, create_sandbox or list_sandboxes returned it."

// createInput is what create_sandbox and get_or_create_sandbox take.
type createInput struct {
	Labels       map[string]string `json:"labels,omitempty" jsonschema:"Labels (key/value strings) to find the sandbox by later, e.g. {\"conversation\": \"<chat id>\"}."`
	Image        string            `json:"image,omitempty" jsonschema:"Root filesystem: host (the default: the host's system tools, read-only, with a private writable layer) or an OCI image reference such as python:3.12-slim or node:22 (pulled if need be)."`
	Runtime      string            `json:"runtime,omitempty" jsonschema:"Isolation tier (native or gvisor); leave it out for the daemon's default."`
	Env          map[string]string `json:"env,omitempty" jsonschema:"Environment variables of every command run in the sandbox."`
	Workdir      string            `json:"workdir,omitempty" jsonschema:"Default working directory of commands and relative paths (default /home/user)."`
	MemoryMB     int64             `json:"memory_mb,omitempty" jsonschema:"Memory limit in MiB (swap included); a command past it is killed (oom_killed)."`
	CPUs         float64           `json:"cpus,omitempty" jsonschema:"CPU limit in cores, e.g. 0.5 or 2."`
	Pids         int64             `json:"pids,omitempty" jsonschema:"Most processes and threads at once."`
	DiskMB       int64             `json:"disk_mb,omitempty" jsonschema:"Size of the sandbox's writable disk in MiB."`
	Network      string            `json:"network,omitempty" jsonschema:"What the sandbox may reach: none (loopback only), allowlist (only the domains in allow) or open. Default: the daemon's (none unless configured otherwise)."`
	Allow        []string          `json:"allow,omitempty" jsonschema:"Destinations the sandbox may reach with network allowlist: domains (pypi.org), wildcards (*.pythonhosted.org), addresses or CIDRs, each optionally with :port."`
	IdleTimeoutS int64             `json:"idle_timeout_s,omitempty" jsonschema:"Stop the sandbox after this many seconds without activity (its files are kept; 0 or absent: the daemon's default)."`
}

// maxMiB bounds memory_mb and disk_mb (1 EiB), below where MiB → bytes wraps.
const maxMiB = 1 << 40

func (in createInput) request() (api.CreateSandboxRequest, error) {
	req := api.CreateSandboxRequest{Image: in.Image, Runtime: in.Runtime, Env: in.Env, Workdir: in.Workdir, Labels: in.Labels,
		Limits: api.Limits{MemoryBytes: in.MemoryMB << 20, CPUs: in.CPUs, Pids: in.Pids, DiskBytes: in.DiskMB << 20}}
	for _, x := range []struct {
		name string
		v    float64
	}{{"memory_mb", float64(in.MemoryMB)}, {"cpus", in.CPUs}, {"pids", float64(in.Pids)}, {"disk_mb", float64(in.DiskMB)}, {"idle_timeout_s", float64(in.IdleTimeoutS)}} {
		if x.v < 0 {
			return req, invalid(x.name, "%g is negative", x.v)
		}
	}
	// MiB counts are shifted into bytes: beyond 2^40 MiB they would wrap.
	for _, x := range []struct {
		name string
		v    int64
	}{{"memory_mb", in.MemoryMB}, {"disk_mb", in.DiskMB}} {
		if x.v > maxMiB {
			return req, invalid(x.name, "%d MiB is more than any host has (at most %d)", x.v, int64(maxMiB))
		}
	}
	if in.Network != "" || len(in.Allow) > 0 {
		mode := in.Network
		if mode == "" {
			mode = "allowlist"
		}
		req.Network = &api.Network{Mode: mode, Allow: in.Allow}
	}
	if in.IdleTimeoutS > 0 {
		req.Timeouts.IdleSeconds = ptr(in.IdleTimeoutS)
	}
	return req, nil
}

// sandboxView is a sandbox as a model sees it.
type sandboxView struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Image     string            `json:"image"`
	Runtime   string            `json:"runtime"`
	Workdir   string            `json:"workdir"`
	User      string            `json:"user"`
	Labels    map[string]string `json:"labels,omitempty"`
	Network   string            `json:"network"`
	Limits    api.Limits        `json:"limits"`
	CreatedAt time.Time         `json:"created_at"`
}

func viewOf(sb api.Sandbox) sandboxView {
	return sandboxView{ID: sb.ID, State: sb.State, Image: sb.Image, Runtime: sb.Runtime, Workdir: sb.Workdir, User: sb.User,
		Labels: sb.Labels, Network: sb.Network.Mode, Limits: sb.Limits, CreatedAt: sb.CreatedAt}
}

// describe is one line about a sandbox.
func describe(sb sandboxView) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s, image %s, runtime %s, workdir %s", sb.ID, sb.State, sb.Image, sb.Runtime, sb.Workdir)
	if sb.Network != "" {
		fmt.Fprintf(&b, ", network %s", sb.Network)
	}
	if len(sb.Labels) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(sb.Labels)) {
			parts = append(parts, k+"="+sb.Labels[k])
		}
		fmt.Fprintf(&b, ", labels %s", strings.Join(parts, ","))
	}
	return b.String()
}

type getOrCreateOutput struct {
	Sandbox sandboxView `json:"sandbox"`
	// Created says the sandbox is new (false: an existing one was found).
	Created bool `json:"created"`
}

type sandboxInput struct {
	SandboxID string `json:"sandbox_id"`
}

type listInput struct {
	Labels map[string]string `json:"labels,omitempty" jsonschema:"Only sandboxes that have all these labels (leave out for every sandbox)."`
}

type listOutput struct {
	Sandboxes []sandboxView `json:"sandboxes"`
}

type deleteOutput struct {
	Deleted string `json:"deleted"`
}

// describeSandboxID sets the sandbox_id property's description.
func describeSandboxID(s *jsonschema.Schema) {
	if p := s.Properties["sandbox_id"]; p != nil {
		p.Description = sandboxIDDoc
		p.MinLength = ptr(1)
	}
}

// networkEnum lists the network modes in create's schema.
func networkEnum(s *jsonschema.Schema) {
	s.Properties["network"].Enum = []any{"none", "allowlist", "open"}
}

func (b *backend) addSandboxTools(s *mcp.Server) {
	addTool(s, &mcp.Tool{
		Name:  "get_or_create_sandbox",
		Title: "Get or create a sandbox by labels",
		Description: "Return the sandbox that carries all these labels, creating it (with the other arguments) if there is none, " +
			"and starting it if it was stopped. Use one label per conversation, e.g. {\"conversation\": \"<chat id>\"}, " +
			"so that the conversation keeps its sandbox and files. Returns the sandbox's id for the other tools.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, func(s *jsonschema.Schema) {
		networkEnum(s)
		s.Required = append(s.Required, "labels")
		s.Properties["labels"].MinProperties = ptr(1)
		s.Properties["labels"].Description = "Labels that identify the sandbox, e.g. {\"conversation\": \"<chat id>\"}; at least one."
	}, func(ctx context.Context, in createInput) (getOrCreateOutput, string, error) {
		req, err := in.request()
		if err != nil {
			return getOrCreateOutput{}, "", err
		}
		sb, created, err := b.c.GetOrCreate(ctx, req)
		if err != nil {
			return getOrCreateOutput{}, "", err
		}
		out := getOrCreateOutput{Sandbox: viewOf(sb), Created: created}
		verb := "Found sandbox"
		if created {
			verb = "Created sandbox"
		}
		return out, fmt.Sprintf("%s %s\n%s", verb, sb.ID, describe(out.Sandbox)), nil
	})

	addTool(s, &mcp.Tool{
		Name:  "create_sandbox",
		Title: "Create a sandbox",
		Description: "Create a new, empty sandbox (an isolated Linux computer) and return its id. " +
			"Prefer get_or_create_sandbox, which gives a conversation back its own sandbox; use this for an extra, separate one.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, networkEnum, func(ctx context.Context, in createInput) (sandboxView, string, error) {
		req, err := in.request()
		if err != nil {
			return sandboxView{}, "", err
		}
		sb, err := b.c.CreateSandbox(ctx, req)
		if err != nil {
			return sandboxView{}, "", err
		}
		v := viewOf(sb)
		return v, "Created sandbox " + sb.ID + "\n" + describe(v), nil
	})

	addTool(s, &mcp.Tool{
		Name:        "list_sandboxes",
		Title:       "List sandboxes",
		Description: "List the sandboxes (id, state, image, labels), optionally only those with the given labels.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, func(ctx context.Context, in listInput) (listOutput, string, error) {
		list, err := b.c.ListSandboxes(ctx, in.Labels)
		if err != nil {
			return listOutput{}, "", err
		}
		out := listOutput{Sandboxes: make([]sandboxView, 0, len(list))}
		lines := make([]string, 0, len(list))
		for _, sb := range list {
			v := viewOf(sb)
			out.Sandboxes = append(out.Sandboxes, v)
			lines = append(lines, describe(v))
		}
		if len(lines) == 0 {
			return out, "No sandboxes.", nil
		}
		return out, strings.Join(lines, "\n"), nil
	})

	addTool(s, &mcp.Tool{
		Name:        "delete_sandbox",
		Title:       "Delete a sandbox",
		Description: "Delete a sandbox for good: every process and file in it is gone.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, describeSandboxID, func(ctx context.Context, in sandboxInput) (deleteOutput, string, error) {
		if err := b.c.DeleteSandbox(ctx, in.SandboxID); err != nil {
			return deleteOutput{}, "", err
		}
		return deleteOutput{Deleted: in.SandboxID}, "Deleted sandbox " + in.SandboxID, nil
	})

	addTool(s, &mcp.Tool{
		Name:        "stop_sandbox",
		Title:       "Stop a sandbox",
		Description: "Stop a sandbox: its processes end, its files are kept. start_sandbox brings it back.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, describeSandboxID, func(ctx context.Context, in sandboxInput) (sandboxView, string, error) {
		sb, err := b.c.StopSandbox(ctx, in.SandboxID)
		if err != nil {
			return sandboxView{}, "", err
		}
		v := viewOf(sb)
		return v, "Stopped sandbox " + sb.ID + "\n" + describe(v), nil
	})

	addTool(s, &mcp.Tool{
		Name:        "start_sandbox",
		Title:       "Start a sandbox",
		Description: "Start a stopped sandbox again, with its files as they were.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, describeSandboxID, func(ctx context.Context, in sandboxInput) (sandboxView, string, error) {
		sb, err := b.c.StartSandbox(ctx, in.SandboxID)
		if err != nil {
			return sandboxView{}, "", err
		}
		v := viewOf(sb)
		return v, "Started sandbox " + sb.ID + "\n" + describe(v), nil
	})
}
