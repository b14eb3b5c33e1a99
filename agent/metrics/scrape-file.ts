/**
 * What the gauges that read a file at scrape time share (the cgroup memory limit, the close-hole
 * sidecar's state file): a bounded read of a small file, and leaving a metric out of the scrape
 * when there is nothing true to say.
 */
import { constants } from 'node:fs';
import { open } from 'node:fs/promises';
import type { Counter, Gauge } from 'prom-client';

/** Files bigger than this are not ours (memory.max and the sidecar's state are a few lines). */
const MAX_FILE_BYTES = 4096;

/** Reads a small regular file, at most 4 KiB, with its mtime; undefined when it cannot be read. */
export async function readSmallFile(path: string): Promise<{ text: string; mtimeMs: number } | undefined> {
  let fh;
  try {
    // O_NONBLOCK: a FIFO in the file's place would otherwise hold a libuv thread until a writer came.
    fh = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
    const st = await fh.stat();
    if (!st.isFile()) return undefined;
    const buf = Buffer.alloc(MAX_FILE_BYTES);
    const { bytesRead } = await fh.read(buf, 0, MAX_FILE_BYTES, 0);
    return { text: buf.subarray(0, bytesRead).toString('utf8'), mtimeMs: st.mtimeMs };
  } catch {
    return undefined;
  } finally {
    await fh?.close().catch(() => {});
  }
}

/**
 * Leaves an unlabelled metric out of the scrape. prom-client's reset() puts a 0 back for a metric
 * without labels, and 0 would claim something ("no table", "no limit", "no fail open") we do not
 * know; its value map is the public `hashMap` field (an empty map is what a labelled metric has
 * before its first set). test/unit/ops-metrics.test.ts and close-hole-state.test.ts fail if a
 * prom-client upgrade changes that.
 */
export function leaveOut(metric: Gauge | Counter): void {
  (metric as unknown as { hashMap: Record<string, unknown> }).hashMap = {};
}
