package template

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/berthsh/berth/errdefs"
)

// instruction is one parsed line of a Dockerfile.
type instruction struct {
	cmd      string   // lower case: "run", "copy", …
	args     []string // the words after it (for ENV and LABEL: key, value, key, value…)
	json     bool     // the exec (JSON) form
	flags    []string // "--chown=1000", as written
	line     int
	original string
}

// supported lists the instructions a template build runs and the flags
// each takes.
var supported = map[string][]string{
	"from": nil, "run": nil, "copy": {"chown"}, "add": {"chown"}, "env": nil, "arg": nil,
	"workdir": nil, "user": nil, "label": nil, "entrypoint": nil, "cmd": nil, "expose": nil, "shell": nil,
}

// parse reads a Dockerfile into its instructions: one FROM (ARGs may
// precede it), then the others. An instruction or flag a build does not
// run is invalid_argument naming it and its line.
func parse(dockerfile []byte) ([]instruction, error) {
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "Dockerfile: %v", err)
	}
	var out []instruction
	froms := 0
	for _, n := range res.AST.Children {
		in := instruction{cmd: strings.ToLower(n.Value), json: n.Attributes["json"], flags: n.Flags,
			line: n.StartLine, original: strings.TrimSpace(n.Original)}
		for a := n.Next; a != nil; a = a.Next {
			in.args = append(in.args, a.Value)
		}
		flags, ok := supported[in.cmd]
		if !ok {
			return nil, in.errorf("%s is not supported by berth template builds (supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, LABEL, ENTRYPOINT, CMD, EXPOSE, SHELL)", strings.ToUpper(in.cmd))
		}
		if len(n.Heredocs) > 0 {
			return nil, in.errorf("heredocs are not supported")
		}
		for _, f := range in.flags {
			name, _, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
			if name == "from" {
				return nil, in.errorf("%s --from (a multi-stage build) is not supported", strings.ToUpper(in.cmd))
			}
			if !slices.Contains(flags, name) {
				return nil, in.errorf("flag %s of %s is not supported", f, strings.ToUpper(in.cmd))
			}
		}
		switch in.cmd {
		case "from":
			if froms++; froms > 1 {
				return nil, in.errorf("a second FROM (a multi-stage build) is not supported")
			}
			if len(in.args) != 1 {
				return nil, in.errorf("FROM takes one image (FROM … AS name is for multi-stage builds, which are not supported)")
			}
		case "arg":
		default:
			if froms == 0 {
				return nil, in.errorf("%s before FROM: a Dockerfile begins with FROM (only ARG may come first)", strings.ToUpper(in.cmd))
			}
		}
		if len(in.args) == 0 && in.cmd != "cmd" && in.cmd != "entrypoint" {
			return nil, in.errorf("%s needs arguments", strings.ToUpper(in.cmd))
		}
		out = append(out, in)
	}
	if froms == 0 {
		return nil, errdefs.New(errdefs.InvalidArgument, "Dockerfile: no FROM")
	}
	return out, nil
}

func (in instruction) errorf(format string, args ...any) error {
	return errdefs.New(errdefs.InvalidArgument, "Dockerfile line %d: %s: %s", in.line, in.original, fmt.Sprintf(format, args...))
}
