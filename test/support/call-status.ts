/** How a ProbeApiClient call settled, as a gRPC status name: 'OK' when it resolved. */
import * as grpc from '@grpc/grpc-js';
import { ApiError } from '../../agent/api/client.ts';

/** The gRPC status name a settled call ended with ('OK' when it resolved, `thrown: …` for anything else). */
export async function statusNameOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'OK';
  } catch (err) {
    return err instanceof ApiError ? (grpc.status[err.grpcCode] ?? String(err.grpcCode)) : `thrown: ${String(err)}`;
  }
}
