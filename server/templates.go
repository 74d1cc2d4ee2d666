package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// Builder is what the template routes need of the template builder.
type Builder interface {
	Build(ctx context.Context, tenant string, req api.BuildTemplateRequest, context io.Reader, emit func(api.BuildEvent) error) (api.BuildResult, error)
}

type templatesGroup struct {
	builder Builder
	images  Images
}

// TemplatesAPI is the group of /v1/templates: builds from a Dockerfile,
// and the templates among the images.
func TemplatesAPI(builder Builder, images Images) Group {
	return &templatesGroup{builder: builder, images: images}
}

// Name implements Group.
func (g *templatesGroup) Name() string { return "templates" }

// Routes implements Group.
func (g *templatesGroup) Routes(r *Router) {
	// A template is its builder's tenant's (the operator's for an admin key).
	r.Handle("POST /v1/templates/build", g.build)
	r.Handle("GET /v1/templates", g.list)
}

func (g *templatesGroup) list(w http.ResponseWriter, r *http.Request) error {
	imgs, err := g.images.List(r.Context(), Tenant(r))
	if err != nil {
		return err
	}
	out := []api.Image{}
	for _, img := range imgs {
		if img.Template {
			out = append(out, img)
		}
	}
	return writeJSON(w, http.StatusOK, api.ListImagesResponse{Images: out})
}

// buildRequest reads a build's options from the query: name, dockerfile,
// arg (KEY=VALUE, repeated), no_cache, network (none or open).
func buildRequest(r *http.Request) (api.BuildTemplateRequest, error) {
	q := r.URL.Query()
	req := api.BuildTemplateRequest{Name: q.Get("name"), Dockerfile: q.Get("dockerfile")}
	for _, a := range q["arg"] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return req, errdefs.New(errdefs.InvalidArgument, "arg: %q: want KEY=VALUE", a)
		}
		if req.Args == nil {
			req.Args = map[string]string{}
		}
		req.Args[k] = v
	}
	if s := q.Get("no_cache"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return req, errdefs.New(errdefs.InvalidArgument, "no_cache: %q is not a boolean", s)
		}
		req.NoCache = b
	}
	if s := q.Get("cpus"); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 {
			return req, errdefs.New(errdefs.InvalidArgument, "cpus: %q is not a number of CPUs", s)
		}
		req.CPUs = f
	}
	if s := q.Get("memory_bytes"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return req, errdefs.New(errdefs.InvalidArgument, "memory_bytes: %q is not a number of bytes", s)
		}
		req.MemoryBytes = n
	}
	if s := q.Get("network"); s != "" {
		var n api.Network
		if err := json.Unmarshal([]byte(s), &n); err != nil {
			n = api.Network{Mode: s} // a bare mode: none, open
		}
		req.Network = &n
	}
	return req, nil
}

func (g *templatesGroup) build(w http.ResponseWriter, r *http.Request) error {
	req, err := buildRequest(r)
	if err != nil {
		return err
	}
	if !wantsNDJSON(r) {
		var log []byte
		res, err := g.builder.Build(r.Context(), Tenant(r), req, r.Body, func(ev api.BuildEvent) error {
			switch ev.Type {
			case api.BuildStep:
				log = append(log, "#"+strconv.Itoa(ev.Step)+" "+ev.Instruction+"\n"...)
			case api.BuildStdout, api.BuildStderr:
				if len(log) < 1<<20 {
					log = append(log, ev.Data...)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		res.Log = log
		return writeJSON(w, http.StatusOK, res)
	}
	nd := newNDJSON(w)
	res, err := g.builder.Build(r.Context(), Tenant(r), req, r.Body, func(ev api.BuildEvent) error { return nd.write(ev) })
	if err != nil {
		if !nd.started {
			return err
		}
		nd.write(api.BuildEvent{Type: api.BuildError, Error: apiError(err)})
		return err
	}
	return nd.write(api.BuildEvent{Type: api.BuildDone, Image: &res.Image, Executed: res.Executed, CachedSteps: res.CachedSteps})
}
