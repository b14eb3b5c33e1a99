/** client-auth.ts: CA loading refusals, and the caller checks over real TLS connections. */
import { readFileSync, writeFileSync } from 'node:fs';
import type { IncomingMessage } from 'node:http';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { connect } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { callerRefusal, callerVerified, clientAuthTlsOptions, loadClientCa } from '../../agent/webhook/client-auth.ts';
import { configRefusal as refusal, useCertDir } from '../support/issue-cert.ts';

const f = useCertDir('client-auth-', [
  ['server', 'webhook.test', 'subjectAltName=DNS:webhook.test'],
  ['client', 'apiserver', 'extendedKeyUsage=clientAuth'],
  ['stranger', 'apiserver', 'extendedKeyUsage=clientAuth'],
]);

describe('loadClientCa', () => {
  it('returns the bundle of a real CA', () => {
    expect(loadClientCa(f('client-ca.crt')).toString()).toContain('-----BEGIN CERTIFICATE-----');
  });

  it('refuses a missing file, a file with no certificate, a broken certificate and an oversized file, naming the file', () => {
    expect(refusal(() => loadClientCa(f('nope.crt')))).toMatch(new RegExp(`^cannot read the client CA file ${f('nope.crt')}: .*ENOENT`));
    writeFileSync(f('key-only.pem'), readFileSync(f('client.key')));
    expect(refusal(() => loadClientCa(f('key-only.pem')))).toBe(`the client CA file ${f('key-only.pem')} holds no PEM certificate`);
    writeFileSync(f('broken.pem'), '-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n');
    expect(refusal(() => loadClientCa(f('broken.pem')))).toMatch(new RegExp(`^the client CA file ${f('broken.pem')} does not load: `));
    // A bundle whose second block is broken: OpenSSL alone would skip it and load the first.
    writeFileSync(f('half.pem'), Buffer.concat([readFileSync(f('client-ca.crt')), readFileSync(f('broken.pem'))]));
    expect(refusal(() => loadClientCa(f('half.pem')))).toMatch(new RegExp(`^the client CA file ${f('half.pem')} does not load: `));
    writeFileSync(f('huge.pem'), Buffer.alloc(1024 * 1024 + 1, 'a'));
    expect(refusal(() => loadClientCa(f('huge.pem')))).toBe(`the client CA file ${f('huge.pem')} is larger than 1048576 bytes`);
  });
});

describe('clientAuthTlsOptions', () => {
  it('asks for a client certificate only with a CA, and never fails the handshake for lack of one', () => {
    const ca = Buffer.from('x');
    expect(clientAuthTlsOptions(ca)).toEqual({ requestCert: true, rejectUnauthorized: false, ca });
    expect(clientAuthTlsOptions(undefined)).toEqual({ requestCert: false, rejectUnauthorized: false });
  });
});

describe('callerVerified / callerRefusal over real TLS', () => {
  async function ask(client: { cert?: Buffer; key?: Buffer }): Promise<{ verified: boolean; refusal: string }> {
    const seen = new Promise<{ verified: boolean; refusal: string }>((resolve) => {
      server.once('request', (req: IncomingMessage, res) => {
        resolve({ verified: callerVerified(req), refusal: callerRefusal(req) });
        res.end();
      });
    });
    const socket = connect({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', ca: readFileSync(f('server-ca.crt')), servername: 'webhook.test', ...client });
    socket.on('error', () => {});
    await new Promise((r) => socket.once('secureConnect', r));
    socket.write('GET /validate HTTP/1.1\r\nHost: webhook.test\r\nConnection: close\r\n\r\n');
    try {
      return await seen;
    } finally {
      socket.destroy();
    }
  }
  let server: ReturnType<typeof createServer>;
  beforeAll(async () => {
    server = createServer({ cert: readFileSync(f('server.crt')), key: readFileSync(f('server.key')), ...clientAuthTlsOptions(loadClientCa(f('client-ca.crt'))) });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  it('a certificate the CA signed is verified', async () => {
    expect((await ask({ cert: readFileSync(f('client.crt')), key: readFileSync(f('client.key')) })).verified).toBe(true);
  });

  it('no certificate: not verified, "no client certificate"', async () => {
    expect(await ask({})).toEqual({ verified: false, refusal: 'no client certificate' });
  });

  it('a certificate from another CA: not verified, with the reason and nothing of the certificate', async () => {
    const r = await ask({ cert: readFileSync(f('stranger.crt')), key: readFileSync(f('stranger.key')) });
    expect(r.verified).toBe(false);
    expect(r.refusal).toMatch(/^client certificate not verified: [A-Z_]+/);
    expect(r.refusal.length).toBeLessThanOrEqual('client certificate not verified: '.length + 120);
    expect(r.refusal).not.toContain('apiserver');
  });
});
