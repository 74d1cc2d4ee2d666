// Typed errors that mirror berth's API error classes (errdefs): the daemon
// answers an error as {"error": {"class", "message", "reason"?, "paths"?}}
// with the class's HTTP status; the SDK throws the subclass of BerthError
// for the class, the message kept verbatim. The class names are those of
// the Python SDK (berth.errors).

/** The reason of the Conflict of an apply that both sides' changes to the
 * same paths refused (`paths` lists them; nothing was applied). */
export const MERGE_CONFLICT = "merge_conflict";

/** The error object of the daemon's error answers, of a batch's per-file
 * results and of an exec stream's or a terminal's error events. */
export interface ApiError {
  class: string;
  message: string;
  reason?: string;
  paths?: string[];
}

export interface BerthErrorOptions {
  reason?: string;
  status?: number;
  paths?: string[];
  details?: ApiError | Record<string, unknown>;
  cause?: unknown;
}

/** An error answered by the berth daemon, or the failure to reach it. */
export class BerthError extends Error {
  /** The API's error class this error class stands for. */
  static readonly code: string = "internal";

  /** The error class as the daemon named it: not_found, invalid_argument, … */
  readonly code: string;
  /** The HTTP status of the answer (undefined when there was none). */
  readonly status: number | undefined;
  /** Refines the class for file and port errors: is_directory, not_directory,
   * invalid_path, not_regular_file, no_space, port_closed, merge_conflict. */
  readonly reason: string | undefined;
  /** The paths the error is about (an apply's conflicts), else empty. */
  readonly paths: string[];
  /** The daemon's whole error object, when there was one. */
  readonly details: ApiError | Record<string, unknown> | undefined;

  constructor(message: string, opts: BerthErrorOptions = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.code = (new.target as typeof BerthError).code;
    this.status = opts.status;
    this.reason = opts.reason;
    this.paths = [...(opts.paths ?? [])];
    this.details = opts.details;
  }
}

export class NotFound extends BerthError {
  static override readonly code = "not_found";
}
export class AlreadyExists extends BerthError {
  static override readonly code = "already_exists";
}
export class InvalidArgument extends BerthError {
  static override readonly code = "invalid_argument";
}
export class Conflict extends BerthError {
  static override readonly code = "conflict";
}
export class ResourceExhausted extends BerthError {
  static override readonly code = "resource_exhausted";
}
export class PermissionDenied extends BerthError {
  static override readonly code = "permission_denied";
}
export class Unauthenticated extends BerthError {
  static override readonly code = "unauthenticated";
}
export class Unavailable extends BerthError {
  static override readonly code = "unavailable";
}
export class DeadlineExceeded extends BerthError {
  static override readonly code = "deadline_exceeded";
}
export class NotImplementedByRuntime extends BerthError {
  static override readonly code = "not_implemented";
}
export class InternalError extends BerthError {
  static override readonly code = "internal";
}
/** A request body over its route's bound (raw uploads have none). */
export class TooLarge extends BerthError {
  static override readonly code = "too_large";
}
export class MethodNotAllowed extends BerthError {
  static override readonly code = "method_not_allowed";
}
/** The daemon could not be reached at its URL (down, wrong URL, network);
 * the message names the URL. */
export class DaemonUnreachable extends Unavailable {}

type ErrorClass = new (message: string, opts?: BerthErrorOptions) => BerthError;

const BY_CLASS: Record<string, ErrorClass> = Object.fromEntries(
  [
    NotFound,
    AlreadyExists,
    InvalidArgument,
    Conflict,
    ResourceExhausted,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    DeadlineExceeded,
    NotImplementedByRuntime,
    InternalError,
    TooLarge,
    MethodNotAllowed,
  ].map((c) => [c.code, c]),
);

const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidArgument,
  401: Unauthenticated,
  403: PermissionDenied,
  404: NotFound,
  405: MethodNotAllowed,
  409: Conflict,
  413: TooLarge,
  429: ResourceExhausted,
  501: NotImplementedByRuntime,
  502: Unavailable,
  503: Unavailable,
  504: DeadlineExceeded,
};

function isApiError(v: unknown): v is ApiError {
  return typeof v === "object" && v !== null && typeof (v as ApiError).message === "string";
}

/** How much of an error answer that is not berth's JSON its message keeps. */
export const MAX_ERROR_TEXT = 1024;

/** The error of an error answer: its status and decoded JSON body. Anything
 * else, such as a proxy's HTML page, gives the class of the status and the
 * message "HTTP <status>: <text>", the answer's text (`text`) trimmed and cut
 * at MAX_ERROR_TEXT characters, or the status's name when it has none. */
export function errorFor(status: number, body: unknown, text?: string): BerthError {
  const err = typeof body === "object" && body !== null ? (body as { error?: unknown }).error : undefined;
  if (isApiError(err)) {
    return errorFromApi(err, status);
  }
  const cls = BY_STATUS[status] ?? InternalError;
  let said = (text ?? "").trim();
  if (said.length > MAX_ERROR_TEXT) said = said.slice(0, MAX_ERROR_TEXT) + "…";
  said ||= STATUS_TEXT[status] ?? "";
  return new cls(said ? `HTTP ${status}: ${said}` : `HTTP ${status}`, { status });
}

const STATUS_TEXT: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  413: "Payload Too Large",
  429: "Too Many Requests",
  500: "Internal Server Error",
  501: "Not Implemented",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
};

/** The error of a daemon's error object (an answer's, a batch result's, an event's). */
export function errorFromApi(err: ApiError, status?: number): BerthError {
  const cls = BY_CLASS[String(err.class)] ?? InternalError;
  return new cls(err.message, {
    status,
    reason: typeof err.reason === "string" && err.reason ? err.reason : undefined,
    paths: Array.isArray(err.paths) ? err.paths.map(String) : undefined,
    details: err,
  });
}
