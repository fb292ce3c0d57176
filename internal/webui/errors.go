package webui

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// apiError words a service error as the API does (its Connect code, then the service's
// message) with the HTTP status of the page. Internal errors are logged, not shown: the page
// says the request failed. Pure.
func apiError(err error) (status int, msg string, internal bool) {
	var (
		inv   *metal.InvalidError
		ref   *provision.RefusedError
		forb  *metal.ForbiddenError
		stale *metal.StaleError
		conf  *metal.ConflictError
	)
	code, status := connect.CodeInternal, http.StatusInternalServerError
	switch {
	case errors.As(err, &inv), errors.Is(err, store.ErrAmbiguous):
		code, status = connect.CodeInvalidArgument, http.StatusBadRequest
	case errors.As(err, &forb):
		code, status = connect.CodePermissionDenied, http.StatusForbidden
	case errors.As(err, &ref), errors.As(err, &conf):
		code, status = connect.CodeFailedPrecondition, http.StatusConflict
	case errors.As(err, &stale), errors.Is(err, store.ErrStale):
		code, status = connect.CodeAborted, http.StatusConflict
	case errors.Is(err, store.ErrNotFound):
		code, status = connect.CodeNotFound, http.StatusNotFound
	case errors.Is(err, store.ErrConflict):
		code, status = connect.CodeAlreadyExists, http.StatusConflict
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code, status = connect.CodeDeadlineExceeded, http.StatusServiceUnavailable
	}
	if code == connect.CodeInternal {
		return status, "internal: the request failed; the server's log has the cause", true
	}
	return status, connect.NewError(code, err).Error(), false
}

// serviceError shows a service error as the page of the request.
func (u *UI) serviceError(w http.ResponseWriter, r *http.Request, s *session, err error) {
	status, msg, internal := apiError(err)
	if internal {
		u.log.ErrorContext(r.Context(), "web UI request failed", "path", r.URL.Path, "error", err)
	}
	u.fail(w, r, s, status, msg)
}

// fail answers with an error page (or, to a live refresh, a fragment holding the message).
func (u *UI) fail(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	if s != nil && s.fresh {
		u.render(w, r, status, errorFragment(msg))
		return
	}
	u.render(w, r, status, errorPage(s, msg))
}
