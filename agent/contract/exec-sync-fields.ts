/**
 * Field numbers of CRI runtime.v1's ExecSyncRequest and ExecSyncResponse (k8s.io/cri-api
 * api.proto), the messages the shim forwards to the agent as kubelet sent them and back. Both sides
 * read and write them by hand (no proto files in the shim), so they are named here once.
 */

/** ExecSyncRequest { string container_id = 1; repeated string cmd = 2; int64 timeout = 3; } */
export const EXEC_SYNC_REQUEST = { containerId: 1, cmd: 2, timeout: 3 } as const;

/** ExecSyncResponse { bytes stdout = 1; bytes stderr = 2; int32 exit_code = 3; } */
export const EXEC_SYNC_RESPONSE = { stdout: 1, stderr: 2, exitCode: 3 } as const;
