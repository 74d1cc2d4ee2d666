// berth: self-hosted sandboxes for AI agents.
//
//   import { Berth } from "@berthsh/berth";
//   const berth = new Berth();
//   await using sb = await berth.create();
//   console.log((await sb.exec("echo hello")).stdout);

export {
  ACCESS_TOKEN_HEADER,
  Berth,
  Sandbox,
  type BatchFile,
  type BuildOptions,
  type BerthOptions,
  type CreateOptions,
  type ExecOptions,
  type Forks,
  type ListOptions,
  type NetworkPolicy,
  type ProcessOptions,
  type TerminalOptions,
  type UploadOptions,
  type Where,
} from "./client.js";
export { DEFAULT_URL, type Body } from "./http.js";
export { Terminal, MAX_TTY, type TerminalEvent } from "./terminal.js";
export { tarOf, type TarEntry } from "./tar.js";
export {
  MERGE_CONFLICT,
  AlreadyExists,
  BerthError,
  Conflict,
  DaemonUnreachable,
  DeadlineExceeded,
  InternalError,
  InvalidArgument,
  MethodNotAllowed,
  NotFound,
  NotImplementedByRuntime,
  PermissionDenied,
  ResourceExhausted,
  TooLarge,
  Unauthenticated,
  Unavailable,
  errorFor,
  errorFromApi,
  type ApiError,
  type BerthErrorOptions,
} from "./errors.js";
export {
  SNAPSHOT_PREFIX,
  Diff,
  ExecResult,
  Snapshot,
  type ApplyResult,
  type BuildEvent,
  type BuildResult,
  type Image,
  type ImageConfig,
  type Pool,
  type PullEvent,
  type RuntimeInfo,
  type Secret,
  type Usage,
  type VersionInfo,
  type Change,
  type EgressRecord,
  type ExecEvent,
  type FileError,
  type FileInfo,
  type FileResult,
  type GlobResult,
  type GrepMatch,
  type GrepResult,
  type Line,
  type ListResult,
  type Port,
  type Process,
  type ReadResult,
  type SandboxEvent,
  type SandboxInfo,
  type TTY,
  type WatchEvent,
} from "./types.js";
