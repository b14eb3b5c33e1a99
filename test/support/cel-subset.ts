/**
 * A small evaluator for the subset of CEL (https://github.com/google/cel-spec) that the project's
 * ValidatingAdmissionPolicies use, so their logic can be tested without an API server:
 * literals (strings, ints, bools, null, lists, maps), field selection and indexing, `has()`,
 * `size()`, `dyn()`, `!`, `-`, `+` (strings and lists), `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `&&`,
 * `||` (commutative over errors, as CEL's are), `? :`, the methods startsWith/endsWith/contains/size
 * and Kubernetes' substring, and the macros all/exists on lists and maps (maps iterate their keys).
 * Anything else is a parse error, never a guess.
 *
 * What it does not do: type-checking (the API server refuses a policy that does not compile; this
 * evaluator only runs what it parses), cost limits, and the API server's construction of
 * `request` (fields omitted when empty): fixtures must be shaped as the API server sends them.
 */

/** An evaluation error: CEL's "no such key", "no such overload" and the like. */
export class CelError extends Error {}

type Value = unknown;
type Node =
  | { t: 'lit'; v: Value }
  | { t: 'ident'; name: string }
  | { t: 'select'; operand: Node; field: string }
  | { t: 'index'; operand: Node; index: Node }
  | { t: 'call'; fn: string; target?: Node; args: Node[] }
  | { t: 'list'; items: Node[] }
  | { t: 'map'; entries: [Node, Node][] }
  | { t: 'unary'; op: '!' | '-'; operand: Node }
  | { t: 'binary'; op: string; left: Node; right: Node }
  | { t: 'cond'; test: Node; then: Node; else: Node };

interface Token { k: 'id' | 'num' | 'str' | 'op' | 'end'; v: string }

function tokenize(src: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < src.length) {
    const c = src[i]!;
    if (/\s/.test(c)) { i++; continue; }
    if (/[A-Za-z_]/.test(c)) {
      const m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(src.slice(i))![0];
      out.push({ k: 'id', v: m });
      i += m.length;
      continue;
    }
    if (/[0-9]/.test(c)) {
      const m = /^[0-9]+/.exec(src.slice(i))![0];
      out.push({ k: 'num', v: m });
      i += m.length;
      continue;
    }
    if (c === "'" || c === '"') {
      let j = i + 1;
      let s = '';
      while (j < src.length && src[j] !== c) {
        if (src[j] === '\\') {
          const e = src[j + 1];
          s += e === 'n' ? '\n' : e === 't' ? '\t' : e ?? '';
          j += 2;
        } else s += src[j++];
      }
      if (j >= src.length) throw new SyntaxError(`unterminated string at ${i}`);
      out.push({ k: 'str', v: s });
      i = j + 1;
      continue;
    }
    const two = src.slice(i, i + 2);
    if (['==', '!=', '<=', '>=', '&&', '||'].includes(two)) { out.push({ k: 'op', v: two }); i += 2; continue; }
    if ('!<>?:.,()[]{}-+'.includes(c)) { out.push({ k: 'op', v: c }); i++; continue; }
    throw new SyntaxError(`unexpected character ${JSON.stringify(c)} at ${i}`);
  }
  out.push({ k: 'end', v: '' });
  return out;
}

/** Parses one CEL expression of the supported subset. */
export function parseCel(src: string): Node {
  const toks = tokenize(src);
  let p = 0;
  const peek = (): Token => toks[p]!;
  const isOp = (v: string): boolean => peek().k === 'op' && peek().v === v;
  const expect = (v: string): void => {
    if (!isOp(v)) throw new SyntaxError(`expected ${v}, got ${peek().v || 'end'} in ${src}`);
    p++;
  };
  const expr = (): Node => {
    const test = or();
    if (!isOp('?')) return test;
    p++;
    const then = or();
    expect(':');
    return { t: 'cond', test, then, else: expr() };
  };
  const or = (): Node => {
    let n = and();
    while (isOp('||')) { p++; n = { t: 'binary', op: '||', left: n, right: and() }; }
    return n;
  };
  const and = (): Node => {
    let n = rel();
    while (isOp('&&')) { p++; n = { t: 'binary', op: '&&', left: n, right: rel() }; }
    return n;
  };
  const rel = (): Node => {
    let n = add();
    for (;;) {
      const t = peek();
      const op = t.k === 'op' && ['==', '!=', '<', '<=', '>', '>='].includes(t.v) ? t.v : t.k === 'id' && t.v === 'in' ? 'in' : undefined;
      if (!op) return n;
      p++;
      n = { t: 'binary', op, left: n, right: add() };
    }
  };
  const add = (): Node => {
    let n = unary();
    while (isOp('+')) { p++; n = { t: 'binary', op: '+', left: n, right: unary() }; }
    return n;
  };
  const unary = (): Node => {
    if (isOp('!')) { p++; return { t: 'unary', op: '!', operand: unary() }; }
    if (isOp('-')) { p++; return { t: 'unary', op: '-', operand: unary() }; }
    return member();
  };
  const args = (): Node[] => {
    const a: Node[] = [];
    expect('(');
    if (!isOp(')')) {
      a.push(expr());
      while (isOp(',')) { p++; a.push(expr()); }
    }
    expect(')');
    return a;
  };
  const member = (): Node => {
    let n = primary();
    for (;;) {
      if (isOp('.')) {
        p++;
        const t = toks[p++]!;
        if (t.k !== 'id') throw new SyntaxError(`expected a field name after . in ${src}`);
        n = isOp('(') ? { t: 'call', fn: t.v, target: n, args: args() } : { t: 'select', operand: n, field: t.v };
      } else if (isOp('[')) {
        p++;
        const index = expr();
        expect(']');
        n = { t: 'index', operand: n, index };
      } else return n;
    }
  };
  const primary = (): Node => {
    const t = toks[p++]!;
    if (t.k === 'num') return { t: 'lit', v: Number(t.v) };
    if (t.k === 'str') return { t: 'lit', v: t.v };
    if (t.k === 'id') {
      if (t.v === 'true' || t.v === 'false') return { t: 'lit', v: t.v === 'true' };
      if (t.v === 'null') return { t: 'lit', v: null };
      if (isOp('(')) return { t: 'call', fn: t.v, args: args() };
      return { t: 'ident', name: t.v };
    }
    if (t.k === 'op' && t.v === '(') { const e = expr(); expect(')'); return e; }
    if (t.k === 'op' && t.v === '[') {
      const items: Node[] = [];
      if (!isOp(']')) { items.push(expr()); while (isOp(',')) { p++; items.push(expr()); } }
      expect(']');
      return { t: 'list', items };
    }
    if (t.k === 'op' && t.v === '{') {
      const entries: [Node, Node][] = [];
      if (!isOp('}')) {
        do {
          if (isOp(',')) p++;
          const k = expr();
          expect(':');
          entries.push([k, expr()]);
        } while (isOp(','));
      }
      expect('}');
      return { t: 'map', entries };
    }
    throw new SyntaxError(`unexpected ${t.v || 'end'} in ${src}`);
  };
  const root = expr();
  if (peek().k !== 'end') throw new SyntaxError(`trailing ${peek().v} in ${src}`);
  return root;
}

const isMap = (v: Value): v is Record<string, Value> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** CEL equality: deep, and values of different types are unequal. */
export function celEquals(a: Value, b: Value): boolean {
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => celEquals(x, b[i]));
  if (isMap(a) && isMap(b)) {
    const ka = Object.keys(a);
    return ka.length === Object.keys(b).length && ka.every((k) => Object.hasOwn(b, k) && celEquals(a[k], b[k]));
  }
  return a === b;
}

/** The evaluation environment: top-level names (object, oldObject, request, variables, ...). */
export type CelEnv = Record<string, Value>;

/** Evaluates a parsed expression; throws CelError for CEL's runtime errors. */
export function evalCel(n: Node, env: CelEnv): Value {
  switch (n.t) {
    case 'lit': return n.v;
    case 'ident':
      if (!Object.hasOwn(env, n.name)) throw new CelError(`undeclared reference to '${n.name}'`);
      return env[n.name];
    case 'select': {
      const o = evalCel(n.operand, env);
      if (!isMap(o)) throw new CelError(`no such field '${n.field}' on ${o === null ? 'null' : typeof o}`);
      if (!Object.hasOwn(o, n.field)) throw new CelError(`no such key: ${n.field}`);
      return o[n.field];
    }
    case 'index': {
      const o = evalCel(n.operand, env);
      const i = evalCel(n.index, env);
      if (Array.isArray(o)) {
        if (typeof i !== 'number' || i < 0 || i >= o.length) throw new CelError(`index out of bounds: ${String(i)}`);
        return o[i];
      }
      if (isMap(o) && typeof i === 'string') {
        if (!Object.hasOwn(o, i)) throw new CelError(`no such key: ${i}`);
        return o[i];
      }
      throw new CelError('no such overload: index');
    }
    case 'list': return n.items.map((x) => evalCel(x, env));
    case 'map': {
      const m: Record<string, Value> = {};
      for (const [k, v] of n.entries) {
        const key = evalCel(k, env);
        if (typeof key !== 'string') throw new CelError('unsupported map key type');
        m[key] = evalCel(v, env);
      }
      return m;
    }
    case 'unary': {
      const v = evalCel(n.operand, env);
      if (n.op === '!') { if (typeof v !== 'boolean') throw new CelError('no such overload: !'); return !v; }
      if (typeof v !== 'number') throw new CelError('no such overload: -');
      return -v;
    }
    case 'cond': {
      const test = evalCel(n.test, env);
      if (typeof test !== 'boolean') throw new CelError('no such overload: ?:');
      return evalCel(test ? n.then : n.else, env);
    }
    case 'binary': return binary(n.op, n.left, n.right, env);
    case 'call': return call(n, env);
  }
}

/** Evaluates to a boolean or a caught error (for the commutative logical operators). */
function boolOrError(n: Node, env: CelEnv): boolean | CelError {
  try {
    const v = evalCel(n, env);
    if (typeof v !== 'boolean') return new CelError('no such overload: logical operator on a non-bool');
    return v;
  } catch (err) {
    if (err instanceof CelError) return err;
    throw err;
  }
}

function binary(op: string, l: Node, r: Node, env: CelEnv): Value {
  if (op === '&&' || op === '||') {
    const short = op === '||';
    const a = boolOrError(l, env);
    if (a === short) return short;
    const b = boolOrError(r, env);
    if (b === short) return short;
    if (a instanceof CelError) throw a;
    if (b instanceof CelError) throw b;
    return !short;
  }
  const a = evalCel(l, env);
  const b = evalCel(r, env);
  switch (op) {
    case '==': return celEquals(a, b);
    case '!=': return !celEquals(a, b);
    case '+':
      if (typeof a === 'string' && typeof b === 'string') return a + b;
      if (Array.isArray(a) && Array.isArray(b)) return [...a, ...b];
      throw new CelError('no such overload: +');
    case 'in':
      if (Array.isArray(b)) return b.some((x) => celEquals(x, a));
      if (isMap(b)) return typeof a === 'string' && Object.hasOwn(b, a);
      throw new CelError('no such overload: in');
    default: {
      if (typeof a !== typeof b || (typeof a !== 'number' && typeof a !== 'string')) throw new CelError(`no such overload: ${op}`);
      const x = a as number | string;
      const y = b as number | string;
      return op === '<' ? x < y : op === '<=' ? x <= y : op === '>' ? x > y : x >= y;
    }
  }
}

function size(v: Value): number {
  if (typeof v === 'string') return [...v].length;
  if (Array.isArray(v)) return v.length;
  if (isMap(v)) return Object.keys(v).length;
  throw new CelError('no such overload: size');
}

function call(n: Extract<Node, { t: 'call' }>, env: CelEnv): Value {
  if (!n.target) {
    if (n.fn === 'has') {
      const arg = n.args[0];
      if (n.args.length !== 1 || arg?.t !== 'select') throw new SyntaxError('has() takes one field selection');
      const o = evalCel(arg.operand, env);
      if (!isMap(o)) throw new CelError(`has(): no such field '${arg.field}' on ${o === null ? 'null' : typeof o}`);
      return Object.hasOwn(o, arg.field);
    }
    if (n.fn === 'size' && n.args.length === 1) return size(evalCel(n.args[0]!, env));
    // Only the type checker sees dyn(): at run time it is the value itself.
    if (n.fn === 'dyn' && n.args.length === 1) return evalCel(n.args[0]!, env);
    throw new SyntaxError(`unsupported function ${n.fn}()`);
  }
  if (n.fn === 'all' || n.fn === 'exists') {
    const [v, body] = n.args;
    if (n.args.length !== 2 || v?.t !== 'ident' || !body) throw new SyntaxError(`${n.fn}() takes a variable and a predicate`);
    const range = evalCel(n.target, env);
    const items = Array.isArray(range) ? range : isMap(range) ? Object.keys(range) : undefined;
    if (!items) throw new CelError(`no such overload: ${n.fn}`);
    // Like CEL's macros: the answer is decided by any element that decides it; errors only when nothing did.
    let error: CelError | undefined;
    for (const item of items) {
      const r = boolOrError(body, { ...env, [v.name]: item });
      if (r instanceof CelError) error ??= r;
      else if (n.fn === 'all' && !r) return false;
      else if (n.fn === 'exists' && r) return true;
    }
    if (error) throw error;
    return n.fn === 'all';
  }
  const target = evalCel(n.target, env);
  const args = n.args.map((a) => evalCel(a, env));
  if (n.fn === 'size' && args.length === 0) return size(target);
  // Kubernetes' strings library: code points [start, end); out of range is an error.
  if (n.fn === 'substring' && typeof target === 'string' && args.every((a) => typeof a === 'number') && (args.length === 1 || args.length === 2)) {
    const cps = [...target];
    const start = args[0] as number;
    const end = args.length === 2 ? (args[1] as number) : cps.length;
    if (start < 0 || end > cps.length || start > end) throw new CelError(`substring: index out of range: ${start}, ${end}`);
    return cps.slice(start, end).join('');
  }
  if (typeof target === 'string' && typeof args[0] === 'string' && args.length === 1) {
    if (n.fn === 'startsWith') return target.startsWith(args[0]);
    if (n.fn === 'endsWith') return target.endsWith(args[0]);
    if (n.fn === 'contains') return target.includes(args[0]);
  }
  throw new SyntaxError(`unsupported method ${n.fn}()`);
}

/** Evaluates `src` in `env`. */
export function cel(src: string, env: CelEnv): Value {
  return evalCel(parseCel(src), env);
}
