/**
 * The webhook's certificate and key, read from files and re-read when they change (cert-manager or
 * a Secret volume rotates them), so new connections get the new certificate without a restart.
 * A pair that does not load (a half-written rotation, a key that does not match) is reported and
 * the previous pair stays in use until the files change again.
 */
import { readFileSync, statSync } from 'node:fs';
import { createSecureContext } from 'node:tls';
import { ConfigError, describeError } from '../errors.ts';
import type { Logger } from '../log.ts';

export interface TlsPair {
  cert: Buffer;
  key: Buffer;
}

/** Largest certificate or key file read (a chain of a few certificates is a few KiB). */
const MAX_PEM_BYTES = 1024 * 1024;

/** Identity of the files' current contents, cheap to compare: a Secret update swaps a symlink, changing inode and mtime. */
function signature(files: readonly string[]): string {
  return files.map((f) => {
    try {
      const s = statSync(f);
      return `${s.ino}:${s.size}:${s.mtimeMs}`;
    } catch (err) {
      return `missing:${(err as NodeJS.ErrnoException).code ?? ''}`;
    }
  }).join('|');
}

/** Reads and checks a certificate/key pair; throws ConfigError naming the file and the reason. */
export function loadTlsPair(certFile: string, keyFile: string): TlsPair {
  const read = (file: string, what: string): Buffer => {
    let buf: Buffer;
    try {
      buf = readFileSync(file);
    } catch (err) {
      throw new ConfigError(`cannot read the TLS ${what} ${file}: ${describeError(err)}`, { file });
    }
    if (buf.length > MAX_PEM_BYTES) throw new ConfigError(`the TLS ${what} ${file} is larger than ${MAX_PEM_BYTES} bytes`, { file });
    return buf;
  };
  const pair = { cert: read(certFile, 'certificate'), key: read(keyFile, 'key') };
  try {
    createSecureContext(pair);
  } catch (err) {
    throw new ConfigError(`the TLS certificate ${certFile} and key ${keyFile} do not load: ${describeError(err)}`, { certFile, keyFile });
  }
  return pair;
}

/** Polls the two files and calls `apply` with each new pair that loads. */
export class TlsFileWatcher {
  readonly #files: readonly [string, string];
  readonly #apply: (pair: TlsPair) => void;
  readonly #log: Logger;
  #seen: string;
  #timer: NodeJS.Timeout | undefined;

  constructor(certFile: string, keyFile: string, apply: (pair: TlsPair) => void, log: Logger) {
    this.#files = [certFile, keyFile];
    this.#apply = apply;
    this.#log = log;
    this.#seen = signature(this.#files);
  }

  /** Starts polling every `intervalMs`. */
  start(intervalMs: number): void {
    this.#timer = setInterval(() => this.check(), intervalMs);
    this.#timer.unref();
  }

  /** Looks at the files now; returns true when a new pair was applied. */
  check(): boolean {
    const now = signature(this.#files);
    if (now === this.#seen) return false;
    this.#seen = now;
    let pair: TlsPair;
    try {
      pair = loadTlsPair(...this.#files);
    } catch (err) {
      this.#log.warn('TLS files changed but do not load; keeping the previous certificate', { error: describeError(err) });
      return false;
    }
    this.#apply(pair);
    this.#log.info('TLS certificate reloaded', { certFile: this.#files[0] });
    return true;
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
  }
}
