/** A GET over a unix socket (the shim's metrics socket, for one): status and body. */
import { request } from 'node:http';

/** GETs `urlPath` from the HTTP server on `socketPath`. */
export function getUnix(socketPath: string, urlPath: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path: urlPath }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}
