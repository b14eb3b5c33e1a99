/**
 * Reads a kubelet v1.PodList one pod at a time, as its bytes arrive: the whole answer is never
 * held, only the pod being read (up to a per-pod cap). A pod larger than the cap is skipped (its
 * identity, read from its first bytes, is kept for the log and the metric), a pod that is not
 * valid JSON is reported, and every other pod is handed on. Only an answer that is not a PodList at
 * all, or is cut short, is refused as a whole.
 */
import { createHash } from 'node:crypto';
import { KubeletError } from './kubelet-client.ts';

/** Why a pod of the list was dropped; a bounded set, used as a metric label. */
export type DroppedPodReason = 'too-large' | 'too-many' | 'malformed' | 'invalid';
export const DROPPED_POD_REASONS: readonly DroppedPodReason[] = ['too-large', 'too-many', 'malformed', 'invalid'];

/** A pod of the list that was not parsed: too large, beyond the pod cap, or not JSON. */
export class DroppedPodItem {
  readonly reason: DroppedPodReason;
  readonly message: string;
  readonly bytes: number;
  readonly identity: { uid?: string; namespace?: string; name?: string };
  constructor(reason: DroppedPodReason, message: string, bytes: number, identity: { uid?: string; namespace?: string; name?: string }) {
    this.reason = reason;
    this.message = message;
    this.bytes = bytes;
    this.identity = identity;
  }
}

/** The list as read: top-level fields, and each item parsed or dropped. */
export interface StreamedPodList {
  kind?: unknown;
  apiVersion?: unknown;
  /** Parsed items; DroppedPodItem for the ones that were not. Not an array when the answer's items was not one. */
  items: unknown;
}

/** Bytes of an oversized pod kept to read its name, namespace and uid (metadata comes first in kubelet's JSON). */
const IDENTITY_PREFIX_BYTES = 4096;
/** Largest top-level scalar (kind, apiVersion, a non-list items) kept. */
const MAX_TOP_VALUE_BYTES = 1024;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJ = 0x7b;
const CLOSE_OBJ = 0x7d;
const OPEN_ARR = 0x5b;
const CLOSE_ARR = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;

function isSpace(b: number): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}

/** Name, namespace and uid as far as the first bytes of a pod's JSON show them. */
export function identityFromPrefix(prefix: string): { uid?: string; namespace?: string; name?: string } {
  const meta = prefix.indexOf('"metadata"');
  const text = meta >= 0 ? prefix.slice(meta) : prefix;
  const field = (key: string): string | undefined => {
    const m = new RegExp(`"${key}"\\s*:\\s*"([^"\\\\]{1,253})"`).exec(text);
    return m?.[1];
  };
  const out: { uid?: string; namespace?: string; name?: string } = {};
  const name = field('name');
  const namespace = field('namespace');
  const uid = field('uid');
  if (name) out.name = name;
  if (namespace) out.namespace = namespace;
  if (uid) out.uid = uid;
  return out;
}

/**
 * Splits a PodList byte stream into items. Feed chunks with push(), then end(). Tracks only what
 * it must (nesting, strings, the top-level keys): the JSON of each item is checked by JSON.parse.
 */
export class PodListSplitter {
  readonly #maxPodBytes: number;
  readonly #maxPods: number;
  readonly #hash = createHash('sha256');
  #depth = 0;
  #inString = false;
  #escape = false;
  #started = false;
  #done = false;
  /** Top level: the key being read, and whether the next string is a key. */
  #expectKey = false;
  #keyBytes: number[] | undefined;
  #key = '';
  /** A top-level scalar value being captured (kind, apiVersion, a non-list items). */
  #topValue: number[] | undefined;
  #topValueKey = '';
  #inItems = false;
  /** The item being read. */
  #item: { chunks: Buffer[]; bytes: number; prefix: Buffer[]; prefixBytes: number; scalar: boolean } | undefined;
  readonly #top: Record<string, unknown> = {};
  readonly items: unknown[] = [];
  totalBytes = 0;

  /** Items of the previous list by digest: an unchanged pod is not parsed again (most polls change nothing). */
  readonly #previous: ReadonlyMap<string, unknown>;
  /** Items of this list by digest, for the next one. */
  readonly parsedByDigest = new Map<string, unknown>();

  /** Maps each parsed item at once (to a compact form), so that no raw pod JSON outlives its item. */
  readonly #convert: (raw: unknown) => unknown;

  constructor(opts: { maxPodBytes: number; maxPods: number; previous?: ReadonlyMap<string, unknown>; convert?: (raw: unknown) => unknown }) {
    this.#maxPodBytes = opts.maxPodBytes;
    this.#maxPods = opts.maxPods;
    this.#previous = opts.previous ?? new Map();
    this.#convert = opts.convert ?? ((raw) => raw);
  }

  /** Feeds the next bytes of the answer; throws KubeletError('malformed') when it is not a PodList object. */
  push(chunk: Buffer): void {
    this.#hash.update(chunk);
    this.totalBytes += chunk.length;
    let itemFrom = this.#item ? 0 : -1;
    // The next backslash at or after a position, found once per run (searching again from every
    // string would rescan the rest of the chunk each time).
    let nextSlash = -1;
    for (let i = 0; i < chunk.length; i++) {
      const b = chunk[i] as number;
      if (this.#done) {
        if (!isSpace(b)) throw malformed('bytes after the end of the PodList object');
        continue;
      }
      if (this.#inString && this.#depth > 1 && !this.#escape) {
        // Inside a pod: jump to the string's end (most of a pod's bytes), minding escapes.
        const quote = chunk.indexOf(QUOTE, i);
        if (nextSlash !== chunk.length && nextSlash < i) {
          nextSlash = chunk.indexOf(BACKSLASH, i);
          if (nextSlash === -1) nextSlash = chunk.length;
        }
        const slash = nextSlash < chunk.length ? nextSlash : -1;
        if (slash !== -1 && (quote === -1 || slash < quote)) {
          if (slash + 1 < chunk.length) i = slash + 1; // the escaped byte; the loop steps past it
          else {
            this.#escape = true;
            i = slash;
          }
          continue;
        }
        if (quote === -1) {
          i = chunk.length - 1;
          continue;
        }
        i = quote;
        this.#inString = false;
        continue;
      }
      if (this.#inString) {
        if (this.#escape) this.#escape = false;
        else if (b === BACKSLASH) this.#escape = true;
        else if (b === QUOTE) {
          this.#inString = false;
          if (this.#keyBytes && this.#depth === 1) {
            this.#key = Buffer.from(this.#keyBytes).toString('utf8');
            this.#keyBytes = undefined;
            continue;
          }
        }
        if (this.#depth === 1) {
          if (this.#keyBytes) {
            if (this.#keyBytes.length < 256) this.#keyBytes.push(b);
          } else if (this.#topValue && this.#topValue.length < MAX_TOP_VALUE_BYTES) this.#topValue.push(b);
        }
        continue;
      }
      // Blanks outside strings mean nothing here: skip a run of them at once.
      if (isSpace(b)) {
        while (i + 1 < chunk.length && isSpace(chunk[i + 1] as number)) i++;
        continue;
      }
      if (!this.#started) {
        if (b !== OPEN_OBJ) throw malformed('the answer is not a JSON object');
        this.#started = true;
        this.#depth = 1;
        this.#expectKey = true;
        continue;
      }
      // An item of the items list starts at the first non-blank byte at list level.
      if (this.#inItems && this.#depth === 2 && !this.#item && !isSpace(b) && b !== COMMA && b !== CLOSE_ARR) {
        this.#item = { chunks: [], bytes: 0, prefix: [], prefixBytes: 0, scalar: b !== OPEN_OBJ && b !== OPEN_ARR };
        itemFrom = i;
      }
      if (b === QUOTE) {
        this.#inString = true;
        if (this.#depth === 1 && this.#expectKey) this.#keyBytes = [];
        else if (this.#depth === 1 && this.#topValue) this.#topValue.push(b);
        continue;
      }
      if (b === OPEN_OBJ || b === OPEN_ARR) {
        if (this.#depth === 1 && this.#topValueKey === 'items') {
          // The items list is read item by item; an object there is kept as "not a list".
          this.#topValue = undefined;
          this.#topValueKey = '';
          if (b === OPEN_ARR) {
            this.#inItems = true;
            this.#itemsSeen = true;
          } else {
            this.#top['items'] = {};
          }
        }
        this.#depth++;
        continue;
      }
      if (b === CLOSE_OBJ || b === CLOSE_ARR) {
        if (this.#item && this.#depth === 2 && this.#item.scalar) {
          // A scalar item ends at the list's closing bracket.
          this.#endItem(chunk, itemFrom, i);
          itemFrom = -1;
        }
        this.#depth--;
        if (this.#depth === 2 && this.#item && !this.#item.scalar) {
          this.#endItem(chunk, itemFrom, i + 1);
          itemFrom = -1;
        } else if (this.#depth === 1 && this.#inItems) {
          this.#inItems = false;
          this.#key = '';
        } else if (this.#depth === 0) {
          this.#endTopValue();
          this.#done = true;
        }
        continue;
      }
      if (this.#depth === 1) {
        if (b === COLON) {
          this.#expectKey = false;
          if (this.#key === 'kind' || this.#key === 'apiVersion' || this.#key === 'items') {
            this.#topValue = [];
            this.#topValueKey = this.#key;
          }
        } else if (b === COMMA) {
          this.#endTopValue();
          this.#expectKey = true;
          this.#key = '';
        } else if (this.#topValue && !isSpace(b) && this.#topValue.length < MAX_TOP_VALUE_BYTES) this.#topValue.push(b);
        continue;
      }
      if (this.#item && this.#item.scalar && this.#depth === 2 && b === COMMA) {
        this.#endItem(chunk, itemFrom, i);
        itemFrom = -1;
      }
    }
    if (this.#item && itemFrom >= 0) this.#addToItem(chunk.subarray(itemFrom));
  }

  /** Ends the answer: the list as read, and a digest of its bytes (same bytes, same digest). */
  end(): { list: StreamedPodList; digest: string } {
    if (!this.#done) throw malformed(this.#started ? 'the answer ends before the PodList object does (cut short?)' : 'the answer is empty');
    const items = this.#itemsSeen ? this.items : this.#top['items'];
    return { list: { kind: this.#top['kind'], apiVersion: this.#top['apiVersion'], items }, digest: this.#hash.digest('hex') };
  }

  /** The items value was a list (read item by item). */
  #itemsSeen = false;

  #endTopValue(): void {
    if (!this.#topValue) return;
    const raw = Buffer.from(this.#topValue).toString('utf8').trim();
    const key = this.#topValueKey;
    this.#topValue = undefined;
    this.#topValueKey = '';
    if (key === 'items') {
      // Not a list (null, a number, a string): kept as it was, for the caller to refuse.
      try {
        this.#top['items'] = JSON.parse(raw) as unknown;
      } catch {
        this.#top['items'] = raw;
      }
      return;
    }
    try {
      this.#top[key] = JSON.parse(raw) as unknown;
    } catch {
      this.#top[key] = raw;
    }
  }

  #addToItem(part: Buffer): void {
    const item = this.#item;
    if (!item || part.length === 0) return;
    if (item.prefixBytes < IDENTITY_PREFIX_BYTES) {
      const take = part.subarray(0, IDENTITY_PREFIX_BYTES - item.prefixBytes);
      item.prefix.push(Buffer.from(take));
      item.prefixBytes += take.length;
    }
    item.bytes += part.length;
    if (item.bytes <= this.#maxPodBytes) item.chunks.push(Buffer.from(part));
    else item.chunks = [];
  }

  #endItem(chunk: Buffer, from: number, to: number): void {
    if (from >= 0) this.#addToItem(chunk.subarray(from, to));
    const item = this.#item;
    this.#item = undefined;
    if (!item) return;
    const prefix = (): { uid?: string; namespace?: string; name?: string } => identityFromPrefix(Buffer.concat(item.prefix).toString('utf8'));
    if (this.items.length >= this.#maxPods) {
      // Not parsed: beyond the cap, a pod costs only its identity.
      this.items.push(new DroppedPodItem('too-many', `pod beyond the cap of ${this.#maxPods} pods per list`, item.bytes, prefix()));
      return;
    }
    if (item.bytes > this.#maxPodBytes) {
      this.items.push(new DroppedPodItem('too-large', `pod is ${item.bytes} bytes, more than the ${this.#maxPodBytes}-byte cap per pod (--kubelet-max-pod-bytes)`, item.bytes, prefix()));
      return;
    }
    const bytes = Buffer.concat(item.chunks);
    const digest = createHash('sha256').update(bytes).digest('base64');
    const known = this.parsedByDigest.get(digest) ?? this.#previous.get(digest);
    if (known !== undefined) {
      this.items.push(known);
      this.parsedByDigest.set(digest, known);
      return;
    }
    try {
      const parsed = this.#convert(JSON.parse(bytes.toString('utf8')) as unknown);
      this.items.push(parsed);
      this.parsedByDigest.set(digest, parsed);
    } catch (err) {
      this.items.push(new DroppedPodItem('malformed', `pod is not valid JSON: ${(err as Error).message}`, item.bytes, prefix()));
    }
  }
}

function malformed(why: string): KubeletError {
  return new KubeletError('malformed', `kubelet /pods answered with invalid JSON: ${why}`);
}
