package e2b

// E2B's templates are berth's images and templates, by name: the
// template routes list, inspect and remove them. Building one through
// E2B's API (its Template SDK) is not served: berth builds templates from
// a Dockerfile (berth template build), and a sandbox is then created
// with the template's name.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/image"
	"github.com/berthsh/berth/server"
)

// defaultTemplate is E2B's default template name.
const defaultTemplate = "base"

// errBuildTemplates answers E2B's template building, rebuilding and tagging.
var errBuildTemplates = errdefs.New(errdefs.NotImplemented,
	"building templates through E2B's API is not served by berth: build one from a Dockerfile with `berth template build -t NAME DIR` and create sandboxes with template NAME")

// templateInfo is E2B's Template and, with Builds, TemplateWithBuilds.
type templateInfo struct {
	TemplateID string    `json:"templateID"`
	BuildID    string    `json:"buildID"`
	CPUCount   int64     `json:"cpuCount"`
	MemoryMB   int64     `json:"memoryMB"`
	DiskSizeMB int64     `json:"diskSizeMB"`
	Public     bool      `json:"public"`
	Aliases    []string  `json:"aliases"`
	Names      []string  `json:"names"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	// CreatedBy is always null: berth has no users.
	CreatedBy     *struct{}       `json:"createdBy"`
	LastSpawnedAt *time.Time      `json:"lastSpawnedAt"`
	SpawnCount    int64           `json:"spawnCount"`
	BuildCount    int             `json:"buildCount"`
	EnvdVersion   string          `json:"envdVersion"`
	BuildStatus   string          `json:"buildStatus"`
	Builds        []templateBuild `json:"builds,omitempty"`
}

// templateBuild is E2B's TemplateBuild: a berth image is one build.
type templateBuild struct {
	BuildID     string    `json:"buildID"`
	Status      string    `json:"status"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	FinishedAt  time.Time `json:"finishedAt"`
	CPUCount    int64     `json:"cpuCount"`
	MemoryMB    int64     `json:"memoryMB"`
	DiskSizeMB  int64     `json:"diskSizeMB"`
	EnvdVersion string    `json:"envdVersion"`
}

// routeTemplates registers the template routes.
func (g *Group) routeTemplates(handle func(string, func(http.ResponseWriter, *http.Request) error)) {
	handle("GET /templates", g.listTemplates)
	handle("GET /v2/templates", g.listTemplates)
	handle("GET /templates/{id}", g.getTemplate)
	handle("DELETE /templates/{id}", g.deleteTemplate)
	handle("GET /templates/aliases/{alias}", g.templateAlias)
	for _, p := range []string{"POST /templates", "POST /v2/templates", "POST /v3/templates"} {
		handle(p, func(http.ResponseWriter, *http.Request) error { return errBuildTemplates })
	}
}

// isTemplatePath says whether path is under E2B's template routes.
func isTemplatePath(path string) bool {
	for _, p := range []string{"/templates", "/v2/templates", "/v3/templates"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// templateRef is the berth image reference an E2B template name stands
// for: Config.Templates's mapping, "base" for the host image, else the
// name itself.
func (g *Group) templateRef(name string) string {
	if ref, ok := g.cfg.Templates[name]; ok {
		return ref
	}
	if name == defaultTemplate {
		return image.Host
	}
	return name
}

// templateImage resolves an E2B template name to a berth image that
// exists for tenant: only its stored images and templates and the
// operator's (and the host image, and snapshots, which the manager looks
// up) count; nothing is pulled.
func (g *Group) templateImage(ctx context.Context, tenant, name string) (string, error) {
	ref := g.templateRef(name)
	if ref == image.Host || strings.HasPrefix(ref, api.SnapshotPrefix) {
		return ref, nil
	}
	if g.images == nil {
		return "", errTemplateNotFound(name, nil)
	}
	if _, err := g.images.Inspect(ctx, tenant, ref); err != nil {
		return "", errTemplateNotFound(name, err)
	}
	return ref, nil
}

// errTemplateNotFound is the answer for a template berth does not have (a
// name that is no image reference at all is not one either).
func errTemplateNotFound(name string, cause error) error {
	if cause != nil && !errors.Is(cause, errdefs.NotFound) && !errors.Is(cause, errdefs.InvalidArgument) {
		return cause
	}
	return errdefs.New(errdefs.NotFound, "template %q not found: berth has no image or template of that name (build one with `berth template build`, or pull an image with `berth image pull`)", name)
}

// familiarName is how a user writes a stored image's name: without
// Docker Hub's registry and library/ and without :latest. Names by
// digest are not template names ("").
func familiarName(n string) string {
	if strings.Contains(n, "@") {
		return ""
	}
	for _, p := range []string{"index.docker.io/", "docker.io/"} {
		if rest, ok := strings.CutPrefix(n, p); ok {
			n = strings.TrimPrefix(rest, "library/")
			break
		}
	}
	return strings.TrimSuffix(n, ":latest")
}

// buildUUID is a stable UUID for an image id: E2B's build ids are UUIDs.
func buildUUID(id string) string {
	h := sha256.Sum256([]byte(id))
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// templateOfImage is the E2B template of a berth image; the host image
// is img with ID image.Host.
func (g *Group) templateOfImage(img api.Image, created time.Time) templateInfo {
	var names []string
	for _, n := range img.Names {
		if f := familiarName(n); f != "" && !slices.Contains(names, f) {
			names = append(names, f)
		}
	}
	id := img.ID
	if len(names) > 0 {
		id = names[0]
	}
	// Aliases: every name of Config.Templates (and "base") that stands for it.
	aliases := slices.Clone(names)
	for _, alias := range append(sortedKeys(g.cfg.Templates), defaultTemplate) {
		ref := g.templateRef(alias)
		if (ref == img.ID || slices.Contains(names, familiarName(ref)) || slices.Contains(img.Names, ref)) && !slices.Contains(aliases, alias) {
			aliases = append(aliases, alias)
		}
	}
	if aliases == nil {
		aliases = []string{}
	}
	sz := g.sizesOf("", api.Limits{})
	build := buildUUID(img.ID)
	t := templateInfo{
		TemplateID: id, BuildID: build, CPUCount: sz.cpus, MemoryMB: sz.memBytes >> 20, DiskSizeMB: sz.diskBytes >> 20,
		Aliases: aliases, Names: aliases, CreatedAt: created.UTC(), UpdatedAt: created.UTC(),
		BuildCount: 1, EnvdVersion: EnvdVersion, BuildStatus: "ready",
	}
	return t
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// hostTemplate is the host image as a template. It has no build time:
// it is the host's system as it is now.
func (g *Group) hostTemplate() templateInfo {
	return g.templateOfImage(api.Image{ID: image.Host, Names: []string{image.Host}}, g.cfg.Now())
}

// listTemplates is GET /templates and /v2/templates: the host image and
// every named image and template, all at once.
func (g *Group) listTemplates(w http.ResponseWriter, r *http.Request) error {
	out := []templateInfo{g.hostTemplate()}
	if g.images != nil {
		imgs, err := g.images.List(r.Context(), server.Tenant(r))
		if err != nil {
			return err
		}
		for _, img := range imgs {
			if t := g.templateOfImage(img, img.CreatedAt); t.TemplateID != img.ID {
				out = append(out, t) // unnamed images are no one's template
			}
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

// lookupTemplate is the template an E2B name or id stands for, for tenant.
func (g *Group) lookupTemplate(ctx context.Context, tenant, name string) (templateInfo, error) {
	ref := g.templateRef(name)
	if ref == image.Host {
		return g.hostTemplate(), nil
	}
	if g.images == nil {
		return templateInfo{}, errTemplateNotFound(name, nil)
	}
	img, err := g.images.Inspect(ctx, tenant, ref)
	if err != nil {
		return templateInfo{}, errTemplateNotFound(name, err)
	}
	t := g.templateOfImage(img, img.CreatedAt)
	t.SpawnCount = int64(len(img.InUse))
	return t, nil
}

// getTemplate is GET /templates/{id}: the template with its one build.
func (g *Group) getTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := g.lookupTemplate(r.Context(), server.Tenant(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	t.Builds = []templateBuild{{
		BuildID: t.BuildID, Status: t.BuildStatus, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, FinishedAt: t.CreatedAt,
		CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB, EnvdVersion: t.EnvdVersion,
	}}
	return writeJSON(w, http.StatusOK, t)
}

// templateAlias is GET /templates/aliases/{alias}: whether the name is a
// template here.
func (g *Group) templateAlias(w http.ResponseWriter, r *http.Request) error {
	t, err := g.lookupTemplate(r.Context(), server.Tenant(r), r.PathValue("alias"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		TemplateID string `json:"templateID"`
		Public     bool   `json:"public"`
	}{t.TemplateID, false})
}

// deleteTemplate is DELETE /templates/{id}: berth's image remove (a name
// of several goes alone; an image a sandbox is made of stays, 409), or,
// for "snapshot:NAME", E2B's delete_snapshot: berth's snapshot delete.
func (g *Group) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("id")
	ref := g.templateRef(name)
	switch {
	case strings.HasPrefix(name, api.SnapshotPrefix):
		return g.deleteSnapshot(w, r, name)
	case ref == image.Host:
		return errdefs.New(errdefs.InvalidArgument, "template %q is berth's built-in host image: it cannot be deleted", name)
	case strings.HasPrefix(ref, api.SnapshotPrefix):
		return errdefs.New(errdefs.InvalidArgument, "template %q is the daemon's alias of %s: delete the snapshot by that name", name, ref)
	case g.images == nil:
		return errTemplateNotFound(name, nil)
	}
	if _, err := g.images.Remove(r.Context(), server.Tenant(r), ref); err != nil {
		if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
			return errTemplateNotFound(name, err)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
