package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestClassesSurviveWrapping(t *testing.T) {
	base := New(NotFound, "sandbox %q not found", "sb-1")
	wrapped := fmt.Errorf("get: %w", base)
	if !IsNotFound(wrapped) || ClassOf(wrapped) != NotFound {
		t.Fatalf("class lost: %v", ClassOf(wrapped))
	}
	// Outer fmt wrapping is for the log; users see the classified message.
	if Message(wrapped) != "sandbox \"sb-1\" not found" {
		t.Fatalf("message %q", Message(wrapped))
	}
	internal := fmt.Errorf("open /var/lib/secret: %w", errors.New("EIO"))
	if ClassOf(internal) != Internal || Message(internal) != "internal error" {
		t.Fatalf("internal errors must not leak details: %q", Message(internal))
	}
	w := Wrap(InvalidArgument, errors.New("strconv: bad"), "limits.cpus")
	if !IsInvalidArgument(w) || Message(w) != "limits.cpus" {
		t.Fatalf("Wrap: %v %q", ClassOf(w), Message(w))
	}
}

func TestHTTPStatusAndKnown(t *testing.T) {
	for c, code := range map[Class]int{NotFound: 404, InvalidArgument: 400, Conflict: 409, AlreadyExists: 409,
		Unavailable: 503, DeadlineExceeded: 504, Internal: 500, ResourceExhausted: 429, TooLarge: 413, MethodNotAllowed: 405} {
		if HTTPStatus(c) != code {
			t.Errorf("%s -> %d, want %d", c, HTTPStatus(c), code)
		}
		if !Known(string(c)) {
			t.Errorf("%s not known", c)
		}
	}
	if Known("made_up") || HTTPStatus("made_up") != http.StatusInternalServerError {
		t.Error("unknown classes must not be believed")
	}
}
