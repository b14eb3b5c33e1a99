/**
 * Optional verification of the webhook's caller: with a client CA, the TLS server asks every
 * client for a certificate and checks it against that CA; the admission paths (and /metrics on
 * the HTTPS port) then answer only a client whose certificate verified (the API server, with the
 * admission client certificate docs/rewrite.md shows how to configure). /healthz stays open:
 * kubelet's HTTPS probes present no client certificate.
 */
import { X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { IncomingMessage } from 'node:http';
import { createSecureContext, type TLSSocket } from 'node:tls';
import { ConfigError, describeError } from '../errors.ts';

/** Largest CA bundle read (a few certificates are a few KiB). */
const MAX_CA_BYTES = 1024 * 1024;

/** Reads and checks a PEM CA bundle; throws ConfigError naming the file and the reason. */
export function loadClientCa(file: string): Buffer {
  let ca: Buffer;
  try {
    ca = readFileSync(file);
  } catch (err) {
    throw new ConfigError(`cannot read the client CA file ${file}: ${describeError(err)}`, { file });
  }
  if (ca.length > MAX_CA_BYTES) throw new ConfigError(`the client CA file ${file} is larger than ${MAX_CA_BYTES} bytes`, { file });
  if (!ca.includes('-----BEGIN CERTIFICATE-----')) throw new ConfigError(`the client CA file ${file} holds no PEM certificate`, { file });
  try {
    // OpenSSL skips a CA block it cannot parse, which would leave every caller unverified: parse each.
    for (const pem of ca.toString('latin1').match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? []) new X509Certificate(pem);
    createSecureContext({ ca });
  } catch (err) {
    throw new ConfigError(`the client CA file ${file} does not load: ${describeError(err)}`, { file });
  }
  return ca;
}

/** TLS server options that ask for (but do not demand at the handshake) a client certificate. */
export function clientAuthTlsOptions(ca: Buffer | undefined): { requestCert: boolean; rejectUnauthorized: boolean; ca?: Buffer } {
  // rejectUnauthorized stays false: the handshake must succeed for kubelet's probes of /healthz;
  // each request is then checked by callerVerified().
  return ca ? { requestCert: true, rejectUnauthorized: false, ca } : { requestCert: false, rejectUnauthorized: false };
}

/** Whether the request came over a TLS connection whose client certificate verified against the CA. */
export function callerVerified(req: IncomingMessage): boolean {
  const socket = req.socket as TLSSocket;
  return socket.authorized === true;
}

/** Why the caller was not verified, for the 403 answer and the log (never the certificate itself). */
export function callerRefusal(req: IncomingMessage): string {
  const socket = req.socket as TLSSocket;
  const err = socket.authorizationError;
  const peer = typeof socket.getPeerCertificate === 'function' ? socket.getPeerCertificate() : undefined;
  if (!peer || Object.keys(peer).length === 0) return 'no client certificate';
  return `client certificate not verified: ${String(err ?? 'unknown reason').slice(0, 120)}`;
}
