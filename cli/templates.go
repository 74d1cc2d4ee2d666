package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
)

func templateCommand(connect connector) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Build templates from a Dockerfile and list them"}
	var (
		tag, dockerfile, network string
		buildArgs                []string
		noCache, quiet           bool
		cpus                     float64
		memory                   string
	)
	build := &cobra.Command{
		Use:   "build -t NAME [-f Dockerfile] CONTEXT",
		Short: "Build a template from a Dockerfile, each step in a sandbox (CONTEXT is a directory; .dockerignore is honoured)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tag == "" {
				return fmt.Errorf("-t NAME: name the template")
			}
			req := api.BuildTemplateRequest{Name: tag, NoCache: noCache, CPUs: cpus}
			if memory != "" {
				n, err := ParseSize(memory)
				if err != nil {
					return fmt.Errorf("--memory: %w", err)
				}
				req.MemoryBytes = n
			}
			dir := args[0]
			df := dockerfile
			if df == "" {
				df = filepath.Join(dir, "Dockerfile")
			}
			rel, err := filepath.Rel(dir, df)
			if err != nil || strings.HasPrefix(rel, "..") {
				return fmt.Errorf("-f %s: the Dockerfile must be inside the context %s", df, dir)
			}
			req.Dockerfile = filepath.ToSlash(rel)
			for _, a := range buildArgs {
				k, v, ok := strings.Cut(a, "=")
				if !ok {
					v, ok = os.LookupEnv(k) // as docker build: --build-arg NAME takes NAME's value here
				}
				if ok {
					if req.Args == nil {
						req.Args = map[string]string{}
					}
					req.Args[k] = v
				}
			}
			if network != "" {
				req.Network = &api.Network{Mode: network}
			}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(client.ContextTar(pw, dir, req.Dockerfile)) }()
			defer pr.Close()
			c, err := connect()
			if err != nil {
				return err
			}
			out := cmd.ErrOrStderr()
			res, err := c.BuildTemplate(cmd.Context(), req, pr, func(ev api.BuildEvent) {
				if quiet {
					return
				}
				switch ev.Type {
				case api.BuildStep:
					cached := ""
					if ev.Cached {
						cached = " (cached)"
					}
					fmt.Fprintf(out, "[%d/%d] %s%s\n", ev.Step, ev.Steps, ev.Instruction, cached)
				case api.BuildStdout, api.BuildStderr:
					out.Write(ev.Data)
				}
			})
			if err != nil {
				return err
			}
			if !quiet {
				fmt.Fprintf(out, "built %s: %d steps ran, %d from the cache, %s in %d layers\n", tag, res.Executed, res.CachedSteps, humanBytes(res.Image.Size), len(res.Image.Layers))
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.Image.ID)
			return nil
		},
	}
	fl := build.Flags()
	fl.StringVarP(&tag, "tag", "t", "", "the template's name (a sandbox's image: berth create --image NAME)")
	fl.StringVarP(&dockerfile, "file", "f", "", "the Dockerfile (default CONTEXT/Dockerfile)")
	fl.StringArrayVar(&buildArgs, "build-arg", nil, "a build argument KEY=VALUE (repeatable)")
	fl.BoolVar(&noCache, "no-cache", false, "run every step, ignoring the cache")
	fl.StringVar(&network, "network", "", "what RUN steps may reach: none or open (default: the daemon's default)")
	fl.BoolVarP(&quiet, "quiet", "q", false, "print only the template's id")
	fl.Float64Var(&cpus, "cpus", 0, "CPU limit of each step's sandbox (a tenant with a CPU quota gives one)")
	fl.StringVar(&memory, "memory", "", "memory limit of each step's sandbox, e.g. 1G (a tenant with a memory quota gives one)")

	cmd.AddCommand(build, listImagesCommand(connect, "List the templates", (*client.Client).ListTemplates))
	return cmd
}
