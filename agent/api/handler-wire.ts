/**
 * Encodes a Kubernetes probe or lifecycle handler, as JSON in a rewritten exec command
 * (`{"httpGet": {...}}`), into ProbeService's ProbeHandler / LifecycleHandler protobuf bytes.
 * The field numbers are Kubernetes' own (proto/probe/v1alpha1/api.proto mirrors them), so the
 * mapping is field for field; the agent validates values, this only checks JSON types.
 */
import { WireWriter } from './protowire.ts';

/** A handler whose JSON shape cannot be a Kubernetes handler. */
export class HandlerShapeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'HandlerShapeError';
  }
}

type Json = Record<string, unknown>;

function obj(v: unknown, where: string): Json {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new HandlerShapeError(`${where}: expected an object`);
  return v as Json;
}

function str(o: Json, key: string, where: string): string {
  const v = o[key];
  if (v === undefined || v === null) return '';
  if (typeof v !== 'string') throw new HandlerShapeError(`${where}.${key}: expected a string, got ${typeof v}`);
  return v;
}

function port(o: Json, key: string, where: string): Buffer {
  const v = o[key];
  const w = new WireWriter();
  if (typeof v === 'number' && Number.isInteger(v)) {
    // int_val = 0 must still be present on the wire for the oneof to be set: write it explicitly.
    if (v === 0) return Buffer.from([0x08, 0x00]);
    w.varint(1, v);
  } else if (typeof v === 'string' && v !== '') {
    w.bytes(2, v);
  } else {
    throw new HandlerShapeError(`${where}.${key}: expected a port number or name`);
  }
  return w.finish();
}

function httpGet(v: unknown): Buffer {
  const o = obj(v, 'httpGet');
  const w = new WireWriter()
    .bytes(1, str(o, 'path', 'httpGet'))
    .bytes(2, port(o, 'port', 'httpGet'), true)
    .bytes(3, str(o, 'host', 'httpGet'))
    .bytes(4, str(o, 'scheme', 'httpGet'));
  const headers = o['httpHeaders'];
  if (headers !== undefined && headers !== null) {
    if (!Array.isArray(headers)) throw new HandlerShapeError('httpGet.httpHeaders: expected a list');
    headers.forEach((h, i) => {
      const ho = obj(h, `httpGet.httpHeaders[${i}]`);
      const hw = new WireWriter()
        .bytes(1, str(ho, 'name', `httpGet.httpHeaders[${i}]`))
        .bytes(2, str(ho, 'value', `httpGet.httpHeaders[${i}]`))
        // The rewrite's `valueFrom: "annotation"`: the value stays out of the command (kubelet prints it).
        .bytes(100, str(ho, 'valueFrom', `httpGet.httpHeaders[${i}]`));
      w.bytes(5, hw.finish(), true);
    });
  }
  return w.finish();
}

function tcpSocket(v: unknown): Buffer {
  const o = obj(v, 'tcpSocket');
  return new WireWriter().bytes(1, port(o, 'port', 'tcpSocket'), true).bytes(2, str(o, 'host', 'tcpSocket')).finish();
}

function grpcAction(v: unknown): Buffer {
  const o = obj(v, 'grpc');
  const p = o['port'];
  if (typeof p !== 'number' || !Number.isInteger(p)) throw new HandlerShapeError('grpc.port: expected a port number');
  return new WireWriter().varint(1, p).bytes(2, str(o, 'service', 'grpc')).finish();
}

/** Which actions each handler kind may carry, with their field numbers (Kubernetes' numbering). */
const PROBE_ACTIONS = { httpGet: [2, httpGet], tcpSocket: [3, tcpSocket], grpc: [4, grpcAction] } as const;
const LIFECYCLE_ACTIONS = { httpGet: [2, httpGet], tcpSocket: [3, tcpSocket] } as const;

function encode(handler: Json, actions: Record<string, readonly [number, (v: unknown) => Buffer]>, what: string): Buffer {
  const present = Object.keys(actions).filter((k) => handler[k] !== undefined && handler[k] !== null);
  if (present.length !== 1) {
    const others = Object.keys(handler).filter((k) => !(k in actions));
    const hint = others.length ? ` (has ${others.slice(0, 3).join(', ')})` : '';
    throw new HandlerShapeError(`${what}: expected exactly one of ${Object.keys(actions).join(', ')}, got ${present.length}${hint}`);
  }
  const key = present[0] as string;
  const [field, fn] = actions[key] as readonly [number, (v: unknown) => Buffer];
  return new WireWriter().bytes(field, fn(handler[key]), true).finish();
}

/** ProbeHandler bytes for a probe's JSON handler. */
export function encodeProbeHandler(handler: Json): Buffer {
  return encode(handler, PROBE_ACTIONS, 'probe handler');
}

/** LifecycleHandler bytes for a hook's JSON handler. */
export function encodeLifecycleHandler(handler: Json): Buffer {
  return encode(handler, LIFECYCLE_ACTIONS, 'lifecycle handler');
}
