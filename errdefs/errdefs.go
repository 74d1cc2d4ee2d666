// Package errdefs is berth's one vocabulary of error classes: deep code wraps a
// class with %w, the HTTP edge maps a class to a status code, and the Go client
// maps the status back, so IsNotFound works on both sides of the wire.
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
)

// Class names a kind of failure. Its string is the "class" field of API errors.
type Class string

// The classes. Add one only when a caller would act differently on it.
const (
	NotFound          Class = "not_found"
	AlreadyExists     Class = "already_exists"
	InvalidArgument   Class = "invalid_argument"
	Conflict          Class = "conflict"
	ResourceExhausted Class = "resource_exhausted"
	PermissionDenied  Class = "permission_denied"
	Unauthenticated   Class = "unauthenticated"
	Unavailable       Class = "unavailable"
	DeadlineExceeded  Class = "deadline_exceeded"
	NotImplemented    Class = "not_implemented"
	Internal          Class = "internal"
	// TooLarge is a request body over its route's bound: send less, or
	// stream it (raw uploads have none).
	TooLarge Class = "too_large"
	// MethodNotAllowed is a route called with a method it does not serve;
	// the Allow header lists those it does.
	MethodNotAllowed Class = "method_not_allowed"
)

// Error returns the class itself as an error, so errors.Is(err, errdefs.NotFound) works.
func (c Class) Error() string { return string(c) }

// classed is an error with a class and a message meant for API users.
type classed struct {
	class Class
	msg   string
	err   error // optional cause, for the log; not shown to users
}

func (e *classed) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

func (e *classed) Unwrap() []error {
	if e.err != nil {
		return []error{e.class, e.err}
	}
	return []error{e.class}
}

// New returns an error of class c with a message for the user.
func New(c Class, format string, args ...any) error {
	return &classed{class: c, msg: fmt.Sprintf(format, args...)}
}

// Wrap classifies err as c and prefixes it with a message for the user.
func Wrap(c Class, err error, format string, args ...any) error {
	return &classed{class: c, msg: fmt.Sprintf(format, args...), err: err}
}

// ClassOf returns the first class found in err's chain, or Internal.
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	var c Class
	if errors.As(err, &c) {
		return c
	}
	return Internal
}

// Message returns the message safe to show an API user: the classed message
// for classified errors, a generic text for internal ones.
func Message(err error) string {
	var ce *classed
	if errors.As(err, &ce) && ce.class != Internal {
		if ce.err != nil && errors.As(ce.err, new(Class)) {
			// A wrapped classified cause carries user-facing text too.
			return ce.msg + ": " + Message(ce.err)
		}
		return ce.msg
	}
	if c := ClassOf(err); c != Internal && c != "" {
		return err.Error()
	}
	return "internal error"
}

// Is helpers.
func IsNotFound(err error) bool        { return errors.Is(err, NotFound) }
func IsAlreadyExists(err error) bool   { return errors.Is(err, AlreadyExists) }
func IsInvalidArgument(err error) bool { return errors.Is(err, InvalidArgument) }
func IsConflict(err error) bool        { return errors.Is(err, Conflict) }
func IsResourceExhausted(err error) bool {
	return errors.Is(err, ResourceExhausted)
}
func IsUnavailable(err error) bool    { return errors.Is(err, Unavailable) }
func IsNotImplemented(err error) bool { return errors.Is(err, NotImplemented) }
func IsPermissionDenied(err error) bool {
	return errors.Is(err, PermissionDenied)
}

// HTTPStatus maps a class to the status code used at the API edge.
func HTTPStatus(c Class) int {
	switch c {
	case NotFound:
		return http.StatusNotFound
	case AlreadyExists, Conflict:
		return http.StatusConflict
	case InvalidArgument:
		return http.StatusBadRequest
	case ResourceExhausted:
		return http.StatusTooManyRequests
	case PermissionDenied:
		return http.StatusForbidden
	case Unauthenticated:
		return http.StatusUnauthorized
	case Unavailable:
		return http.StatusServiceUnavailable
	case DeadlineExceeded:
		return http.StatusGatewayTimeout
	case NotImplemented:
		return http.StatusNotImplemented
	case TooLarge:
		return http.StatusRequestEntityTooLarge
	case MethodNotAllowed:
		return http.StatusMethodNotAllowed
	default:
		return http.StatusInternalServerError
	}
}

// Known reports whether s names a class; text from untrusted peers (the guest,
// a remote daemon) is checked with it before it is believed.
func Known(s string) bool {
	switch Class(s) {
	case NotFound, AlreadyExists, InvalidArgument, Conflict, ResourceExhausted,
		PermissionDenied, Unauthenticated, Unavailable, DeadlineExceeded, NotImplemented, Internal,
		TooLarge, MethodNotAllowed:
		return true
	}
	return false
}

// Reason refines a class for callers that map errors onto another
// vocabulary (deepagents' file errors): "invalid_argument" with reason
// "is_directory". It travels as the "reason" field of API errors.
type Reason string

// The reasons. Like classes, each is one a caller acts on.
const (
	IsDirectory    Reason = "is_directory"
	NotDirectory   Reason = "not_directory"
	InvalidPath    Reason = "invalid_path"
	NotRegularFile Reason = "not_regular_file"
	NoSpace        Reason = "no_space"
	// NoMatch and NotUnique explain a failed edit: the old text is not in
	// the file, or is there more than once.
	NoMatch   Reason = "no_match"
	NotUnique Reason = "not_unique"
	// PortClosed explains an unavailable port: nothing listens on it in
	// the sandbox (yet), so a caller may wait and try again.
	PortClosed Reason = "port_closed"
	// MergeConflict explains a refused apply: both sides changed the
	// paths the error carries (PathsOf).
	MergeConflict Reason = "merge_conflict"
	// SandboxGone, SandboxStopped and SandboxPaused say that the call
	// failed because of the sandbox, not the path or process it named:
	// the sandbox does not exist (was deleted), or must be started or
	// resumed first. A client may act on them (start and try again).
	SandboxGone    Reason = "sandbox_gone"
	SandboxStopped Reason = "sandbox_stopped"
	SandboxPaused  Reason = "sandbox_paused"
)

type reasoned struct {
	error
	reason Reason
}

func (e *reasoned) Unwrap() error { return e.error }

// WithReason attaches a reason to a classified error.
func WithReason(err error, r Reason) error {
	if err == nil {
		return nil
	}
	return &reasoned{error: err, reason: r}
}

// ReasonOf returns the first reason in err's chain, or "".
func ReasonOf(err error) Reason {
	var r *reasoned
	if errors.As(err, &r) {
		return r.reason
	}
	return ""
}

// KnownReason reports whether s names a reason (checked before believing a peer).
func KnownReason(s string) bool {
	switch Reason(s) {
	case IsDirectory, NotDirectory, InvalidPath, NotRegularFile, NoSpace, NoMatch, NotUnique, PortClosed, MergeConflict,
		SandboxGone, SandboxStopped, SandboxPaused:
		return true
	}
	return false
}

type withPaths struct {
	error
	paths []string
}

func (e *withPaths) Unwrap() error { return e.error }

// WithPaths attaches the paths an error is about (a merge's conflicts); they
// travel as the "paths" field of API errors.
func WithPaths(err error, paths []string) error {
	if err == nil {
		return nil
	}
	return &withPaths{error: err, paths: paths}
}

// PathsOf returns the paths attached to err, or nil.
func PathsOf(err error) []string {
	var p *withPaths
	if errors.As(err, &p) {
		return p.paths
	}
	return nil
}
