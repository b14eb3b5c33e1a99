/**
 * The handler a rewritten exec command carries, derived from the original handler. Two changes,
 * both so a shim call needs nothing but the command and the CRI sandbox's annotations:
 *
 * - a named port (`port: "http"`) becomes the number the same container's `ports` give that name,
 *   as kubelet resolves it (an exact match on `ports[].name`, first match wins, its `containerPort`);
 *   a name that matches nothing stays as written, and the agent fails it as kubelet would;
 * - every `httpGet.httpHeaders` entry keeps its `name` and loses its `value`, replaced by
 *   `"valueFrom": "annotation"`: header values are often secrets, and kubelet prints an exec
 *   probe's command in its events and logs. The agent reads the value from the pod's
 *   `probe-agent.io/original-handlers` annotation (which kubelet copies onto the CRI sandbox), at
 *   `handlers["<container>/<field>"]` -> the original handler -> `httpGet.httpHeaders[i].value`.
 *
 * The annotation keeps the original handler untouched (named port, header values), so the undo
 * gives back exactly what was written. Pure.
 */

type Obj = Record<string, unknown>;

/** What a header entry carries in place of its value inside a rewritten command. */
export const HEADER_VALUE_FROM = 'annotation';

const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);

/** The containerPort the container's `ports` give `name`, or undefined (kubelet's findPortByName). */
export function findPortByName(container: Obj, name: string): number | undefined {
  const ports = container.ports;
  if (!Array.isArray(ports)) return undefined;
  for (const p of ports) {
    if (isObj(p) && p.name === name && typeof p.containerPort === 'number') return p.containerPort;
  }
  return undefined;
}

/** The handler to encode into the command for `original` (`{ httpGet: {...} }` etc.) of `container`. */
export function commandHandler(original: Obj, container: Obj): Obj {
  const out: Obj = {};
  for (const [kind, action] of Object.entries(original)) {
    if (!isObj(action)) {
      out[kind] = action;
      continue;
    }
    const next: Obj = { ...action };
    if (typeof action.port === 'string') {
      const port = findPortByName(container, action.port);
      if (port !== undefined) next.port = port;
    }
    if (kind === 'httpGet' && Array.isArray(action.httpHeaders)) {
      next.httpHeaders = action.httpHeaders.map((h) => (isObj(h) ? withoutValue(h) : h));
    }
    out[kind] = next;
  }
  return out;
}

/** A header entry with its value replaced by a reference to the annotation (key order kept, value's slot reused). */
function withoutValue(header: Obj): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(header)) {
    if (k === 'value') out.valueFrom = HEADER_VALUE_FROM;
    else out[k] = v;
  }
  if (!('valueFrom' in out)) out.valueFrom = HEADER_VALUE_FROM;
  return out;
}

/** Whether a decoded command handler references header values it does not carry. */
export function needsAnnotationValues(handler: Obj): boolean {
  const httpGet = handler.httpGet;
  return isObj(httpGet) && Array.isArray(httpGet.httpHeaders) && httpGet.httpHeaders.some((h) => isObj(h) && h.valueFrom === HEADER_VALUE_FROM);
}
