package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrNotFound: the tenant has no effect under that key.
	ErrNotFound = errors.New("dedup: no effect under that key")
	// ErrNotRetryable: only effects in one of effect.RetryableStatuses can be sent back to pending.
	ErrNotRetryable = errors.New("dedup: effect is not dead, failed or unknown")
	// ErrBodyExpired: the effect's payload was kept apart (retention.payloads) and is gone, so it cannot be
	// sent again. The effect itself is still there to read.
	ErrBodyExpired = errors.New("dedup: the effect's payload expired (retention.payloads): it cannot be sent again")
	// ErrBadCursor is returned for a cursor that no page handed out.
	ErrBadCursor = errors.New("dedup: invalid cursor")
	// ErrLeaseLost: the lease named in a write is no longer the row's (it expired and another dispatcher
	// claimed the row, or an operator retried it); nothing was written.
	ErrLeaseLost = errors.New("dedup: lease lost; another dispatcher owns the row")
	// ErrTypePaused: an operator paused delivery of the effect's type, and the call would have delivered it at
	// once (the dedup proxy); nothing was recorded or claimed.
	ErrTypePaused = errors.New("dedup: delivery of the effect type is paused")
	// ErrUnavailable wraps an error that means the database cannot be reached right now (down, restarting,
	// out of connections, a network fault, a timeout): the same call may succeed later.
	ErrUnavailable = errors.New("dedup: database unavailable")
	// ErrNoPartition is ErrUnavailable's (both match) for a write that found no partition for its row: none
	// covers the present yet (every gateway was down longer than the partitions made ahead, and the
	// partition manager's next pass makes it). Nothing was written.
	ErrNoPartition = errors.New("dedup: no partition for the present yet")
	// ErrUnstorable wraps an error that means Postgres refuses the data itself (a \u0000 in JSON, an
	// untranslatable character, a value over a limit): the same call will fail again. *UnstorableError
	// carries Postgres's reason.
	ErrUnstorable = errors.New("dedup: data cannot be stored")
)

// UnstorableError is the form ErrUnstorable takes: errors.Is(err, ErrUnstorable) holds for it, and Reason says
// what Postgres refused, in words fit for the client that sent the data.
type UnstorableError struct {
	Reason string
	Err    error
}

func (e *UnstorableError) Error() string { return "dedup: data cannot be stored: " + e.Reason }

func (e *UnstorableError) Unwrap() []error { return []error{ErrUnstorable, e.Err} }

// FencedError is returned when a request names a queue job under an epoch lower than one the gateway has
// seen for that job in its queue, or a job of that ID enqueued before a newer one: the worker lost its lease
// to a successor, and may not start effects any more.
type FencedError struct {
	JobID string
	Epoch int64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("dedup: job %q is fenced: epoch %d is behind a newer lease of the job, or the job was "+
		"enqueued again since", e.JobID, e.Epoch)
}

// KeyReusedError is returned when a key the tenant already used arrives with another request.
type KeyReusedError struct {
	Key      string
	Existing *Effect
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("dedup: idempotency key %q was used for another request", e.Key)
}

// translate is where driver errors become the store's: it wraps err with ErrUnavailable or as an
// *UnstorableError when it is one of those, and adds op. Callers branch with errors.Is and never read SQLSTATE
// codes or error text themselves.
func translate(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case unavailable(err):
		return &wrapped{msg: "dedup: " + op + ": database unavailable", sentinel: ErrUnavailable, err: err}
	case noPartition(err):
		return &wrapped{msg: "dedup: " + op + ": no partition for the present yet",
			sentinel: ErrUnavailable, err: fmt.Errorf("%w: %w", ErrNoPartition, err)}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && unstorable(pgErr.Code) {
		return &UnstorableError{Reason: pgErr.Message, Err: err}
	}
	return fmt.Errorf("dedup: %s: %w", op, err)
}

// wrapped is err under a sentinel, whose own text would stutter in the message.
type wrapped struct {
	msg      string
	sentinel error
	err      error
}

func (w *wrapped) Error() string   { return w.msg + ": " + w.err.Error() }
func (w *wrapped) Unwrap() []error { return []error{w.sentinel, w.err} }

// unstorable reports whether a SQLSTATE says the data is at fault: class 22 (data exception: invalid or
// untranslatable characters, \u0000 in jsonb, values out of range) and class 54 (program limit exceeded).
func unstorable(code string) bool {
	return strings.HasPrefix(code, "22") || strings.HasPrefix(code, "54")
}

// Unavailable reports whether err, from any pgx call, means the database cannot be reached right now (down,
// restarting, out of connections, a network fault, a timeout), as opposed to a bug or bad data. It is the test
// translate uses for ErrUnavailable, for the packages that talk to the gateway's database without the store
// (the operator's service layer).
func Unavailable(err error) bool { return err != nil && unavailable(err) }

// Unstorable reports whether err, from any pgx call, means Postgres refused the data itself (an invalid or
// untranslatable character, a \u0000, a value over a limit), and Postgres's reason.
func Unstorable(err error) (reason string, ok bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && unstorable(pgErr.Code) {
		return pgErr.Message, true
	}
	return "", false
}

// ReadOnlySQLState is read_only_sql_transaction: a write on a server that is not (or no longer) the primary.
const ReadOnlySQLState = "25006"

// ReadOnly reports whether err is a write refused because the server is read-only: the connection that met
// it is on the wrong server, and should be dropped rather than reused, so that the next one finds the primary.
func ReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == ReadOnlySQLState
}

// NoPrimary reports whether err says that the servers reached are all read-only: a write refused with 25006,
// or a connection that target_session_attrs=read-write turned down on every host. A failover in progress, or a
// primary set read-only by hand: not a server that does not answer, and an operator looks elsewhere for it.
func NoPrimary(err error) bool {
	// pgconn turns a host down with this text (ValidateConnectTargetSessionAttrsReadWrite), and no type.
	return ReadOnly(err) || err != nil && strings.Contains(err.Error(), "read only connection")
}

// unavailable reports whether err means the database cannot be reached right now, as opposed to a bug.
func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// 08: connection exception; 57P01-03: admin shutdown, crash shutdown, cannot connect now (starting or
		// in recovery); 53300: too many connections; 25006: read-only transaction, which is what a write meets
		// on a primary that was demoted to a standby (or set read-only by a failover tool) under a pooled
		// connection: another server is, or is about to be, the primary. 57P05 and 25P03: Postgres closed the
		// connection for idling (idle_session_timeout, idle_in_transaction_session_timeout), which a
		// statement meets on a pooled connection taken without a ping (the outcome connections): the
		// statement never ran, and runs on another connection.
		c := pgErr.Code
		return strings.HasPrefix(c, "08") || c == "57P01" || c == "57P02" || c == "57P03" || c == "57P05" ||
			c == "25P03" || c == "53300" || c == ReadOnlySQLState
	}
	var netErr net.Error
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) || errors.Is(err, pgconn.ErrConnClosed) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		// pgxpool returns puddle's ErrClosedPool, which is not worth a direct dependency to name.
		strings.Contains(err.Error(), "closed pool")
}

// noPartition reports whether err is Postgres refusing a row that no partition of its table takes: a check
// violation (23514) with no constraint, which is how Postgres reports "no partition of relation ... found for
// row" (a CHECK constraint's violation names its constraint).
func noPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.ConstraintName == "" &&
		strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// closedBeforeUse reports whether err says the statement met a connection the server had closed or was
// closing (shut down, or closed for idling: it sends the reason and hangs up), or that nothing of the
// statement was sent: another connection can take it at once.
func closedBeforeUse(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P05", "25P03":
			return true
		}
		return false
	}
	return pgconn.SafeToRetry(err)
}
