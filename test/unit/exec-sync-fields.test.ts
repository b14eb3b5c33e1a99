/**
 * agent/contract/exec-sync-fields.ts: the field numbers the shim and the agent read and write by
 * hand are those of CRI runtime.v1 (proto/cri/runtime_v1.proto, upstream's) and of ProbeService's
 * ExecSync (proto/probe/v1alpha1/api.proto, which must stay wire-compatible with CRI's).
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { EXEC_SYNC_REQUEST, EXEC_SYNC_RESPONSE } from '../../agent/contract/exec-sync-fields.ts';

/** `name = number` of each field of `message` in a .proto file. */
function fieldsOf(protoFile: string, message: string): Record<string, number> {
  const src = readFileSync(fileURLToPath(new URL(`../../proto/${protoFile}`, import.meta.url)), 'utf8');
  const body = new RegExp(`message ${message} \\{([^}]*)\\}`).exec(src)?.[1];
  if (body === undefined) throw new Error(`${message} not in ${protoFile}`);
  const out: Record<string, number> = {};
  for (const m of body.matchAll(/^\s*(?:repeated\s+)?\w+\s+(\w+)\s*=\s*(\d+);/gm)) out[m[1]!] = Number(m[2]);
  return out;
}

describe("ExecSync's field numbers", () => {
  for (const proto of ['cri/runtime_v1.proto', 'probe/v1alpha1/api.proto']) {
    it(`match ${proto}`, () => {
      expect(fieldsOf(proto, 'ExecSyncRequest')).toEqual({
        container_id: EXEC_SYNC_REQUEST.containerId, cmd: EXEC_SYNC_REQUEST.cmd, timeout: EXEC_SYNC_REQUEST.timeout,
      });
      expect(fieldsOf(proto, 'ExecSyncResponse')).toEqual({
        stdout: EXEC_SYNC_RESPONSE.stdout, stderr: EXEC_SYNC_RESPONSE.stderr, exit_code: EXEC_SYNC_RESPONSE.exitCode,
      });
    });
  }
});
