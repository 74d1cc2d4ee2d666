// Compiled (not run) by test/deepagents.test.mjs against deepagents' own
// type declarations: BerthSandbox declares deepagents' protocol types
// structurally, so this is where a drift between the two would show.
import type { AnyBackendProtocol, BackendFactory, FileInfo, SandboxBackendProtocolV2 } from "deepagents";
import type { BerthSandbox } from "../src/deepagents.js";

export function asSandboxBackend(b: BerthSandbox): SandboxBackendProtocolV2 {
  return b;
}

export function asBackend(b: BerthSandbox): AnyBackendProtocol {
  return b;
}

export function asFactory(b: BerthSandbox): BackendFactory {
  return () => b;
}

export async function listing(b: BerthSandbox): Promise<FileInfo[] | undefined> {
  return (await b.ls("/")).files;
}
