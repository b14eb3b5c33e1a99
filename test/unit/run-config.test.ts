/** `probe-agent run` flag validation: clear errors at start, defaults as documented. */
import { describe, expect, it } from 'vitest';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { kubeletClientOptions, parseRunConfig } from '../../agent/config/run-config.ts';
import { createLogger } from '../../agent/log.ts';
import { parseListenAddress } from '../../agent/config/listen-address.ts';
import { parseDuration } from '../../agent/config/duration.ts';
import { ConfigError } from '../../agent/errors.ts';

const base = {
  kubeletUrl: 'https://$HOST_IP:10250',
  kubeletPollInterval: '5s',
  kubeletRequestTimeout: '10s',
  kubeletMaxResponseBytes: '67108864',
  netnsResolvers: 'cri,procfs,address',
  procRoot: '/proc',
  sandboxedRuntimeHandlers: 'runsc,kata',
  socket: '/run/probe-agent/probe.sock',
  metricsAddress: '127.0.0.1:9809',
  logLevel: 'info',
  logFormat: 'json',
  kubeProbeVersion: '1.34',
  maxConcurrentProbes: '64',
  maxQueuedProbes: '4096',
  shutdownGracePeriod: '10s',
};

describe('parseRunConfig', () => {
  it('fills the kubelet URL from HOST_IP (IPv6 bracketed)', () => {
    expect(parseRunConfig(base, { HOST_IP: '192.0.2.7' }).kubeletUrl).toBe('https://192.0.2.7:10250');
    expect(parseRunConfig(base, { HOST_IP: 'fd00::7' }).kubeletUrl).toBe('https://[fd00::7]:10250');
  });

  it('refuses the $HOST_IP default when HOST_IP is unset, naming the fix', () => {
    expect(() => parseRunConfig(base, {})).toThrow(/HOST_IP.*--kubelet-url/);
  });

  it.each([
    [{ netnsResolvers: 'cri,dns' }, /unknown resolver "dns"/],
    [{ netnsResolvers: 'cri,cri' }, /listed twice/],
    [{ kubeletUrl: 'ftp://x' }, /want http\(s\)/],
    [{ kubeletPollInterval: 'soon' }, /--kubelet-poll-interval: invalid duration/],
    [{ logLevel: 'loud' }, /--log-level/],
    [{ logFormat: 'xml' }, /--log-format/],
    [{ maxConcurrentProbes: '0' }, /--max-concurrent-probes/],
    [{ socket: 'relative.sock' }, /--socket: want an absolute path/],
    [{ shimSocket: 'shim.sock' }, /--shim-socket: want an absolute path/],
    [{ shimSocket: '/run/probe-agent/probe.sock' }, /--shim-socket: must differ from --socket/],
    [{ metricsAddress: 'localhost' }, /--metrics-address/],
    [{ kubeProbeVersion: 'v1' }, /--kube-probe-version/],
    [{ featureGates: 'Nope=true' }, /unknown feature gate "Nope"/],
    [{ featureGates: 'InNamespaceProbes=false' }, /locked/],
    [{ probeTickAlignment: '30ms' }, /--probe-tick-alignment: want 0 or a divisor of 1s/],
    [{ probeTickAlignment: '2s' }, /--probe-tick-alignment: want 0 or a divisor of 1s/],
  ])('rejects %o', (override, message) => {
    expect(() => parseRunConfig({ ...base, ...override }, { HOST_IP: '192.0.2.7' })).toThrow(ConfigError);
    expect(() => parseRunConfig({ ...base, ...override }, { HOST_IP: '192.0.2.7' })).toThrow(message);
  });

  it("puts the shim's socket beside --socket unless --shim-socket names it", () => {
    const env = { HOST_IP: '192.0.2.7' };
    expect(parseRunConfig(base, env).shimSocket).toBe('/run/probe-agent/probe-shim.sock');
    expect(parseRunConfig({ ...base, socket: '/var/run/pa/api.sock' }, env).shimSocket).toBe('/var/run/pa/api-shim.sock');
    expect(parseRunConfig({ ...base, shimSocket: '/run/x/shim.sock' }, env).shimSocket).toBe('/run/x/shim.sock');
  });

  it('aligns probe ticks to 50 ms by default; 0 turns it off', () => {
    expect(parseRunConfig(base, { HOST_IP: '192.0.2.7' }).probeTickAlignmentMs).toBe(50);
    expect(parseRunConfig({ ...base, probeTickAlignment: '0' }, { HOST_IP: '192.0.2.7' }).probeTickAlignmentMs).toBe(0);
    expect(parseRunConfig({ ...base, probeTickAlignment: '100ms' }, { HOST_IP: '192.0.2.7' }).probeTickAlignmentMs).toBe(100);
  });

  it('maps -v onto a log level and keeps gate overrides', () => {
    const cfg = parseRunConfig({ ...base, verbosity: '4', featureGates: 'HappyEyeballs=false' }, { HOST_IP: '192.0.2.7' });
    expect(cfg.logLevel).toBe('debug');
    expect(cfg.featureGates.enabled('HappyEyeballs')).toBe(false);
  });

  it('disables the metrics listener with an empty address', () => {
    expect(parseRunConfig({ ...base, metricsAddress: '' }, { HOST_IP: '192.0.2.7' }).metricsAddress).toBeUndefined();
    expect(parseRunConfig({ ...base, metricsAddress: '[::1]:9809' }, { HOST_IP: '192.0.2.7' }).metricsAddress).toEqual({ host: '::1', port: 9809 });
    expect(() => parseListenAddress('', '--metrics-address')).toThrow(/--metrics-address/);
  });

  it('fills every value a command does not declare from its default (audit has no --socket, no poll interval)', () => {
    const cfg = parseRunConfig({ kubeletUrl: 'http://127.0.0.1:10255' }, {});
    expect(cfg).toMatchObject({ socket: '/run/probe-agent/probe.sock', kubeletPollIntervalMs: 5000, maxConcurrentProbes: 2048, metricsAddress: { host: '127.0.0.1', port: 9809 } });
    expect(cfg.kubeletTokenFile).toBeUndefined();
  });
});

describe('parseDuration', () => {
  it.each([
    ['500ms', 500],
    ['5s', 5000],
    ['1m30s', 90_000],
    ['2', 2000],
    ['1.5s', 1500],
  ])('%s = %d ms', (text, ms) => expect(parseDuration(text)).toBe(ms));

  it.each(['', 's', '5x', '5s3', '-1s'])('refuses %j', (text) => expect(() => parseDuration(text)).toThrow(ConfigError));
});

describe('boolean flags and list env twins', () => {
  async function parse(argv: string[], env: Record<string, string>) {
    const { Command } = await import('commander');
    const { registerRunCommand } = await import('../../agent/cli/run-command.ts');
    const saved = { ...process.env };
    Object.assign(process.env, env);
    try {
      const program = new Command().exitOverride();
      registerRunCommand(program);
      const run = program.commands.find((c) => c.name() === 'run')!;
      run.action(() => {}).exitOverride();
      await program.parseAsync(['node', 'probe-agent', 'run', ...argv]);
      return run.opts();
    } finally {
      for (const k of Object.keys(env)) delete process.env[k];
      Object.assign(process.env, saved);
    }
  }

  it.each([
    [[], {}, false],
    [['--kubelet-insecure-tls'], {}, true],
    [['--kubelet-insecure-tls=false'], {}, false],
    [[], { PROBE_AGENT_KUBELET_INSECURE_TLS: 'false' }, false],
    [[], { PROBE_AGENT_KUBELET_INSECURE_TLS: 'true' }, true],
  ] as [string[], Record<string, string>, boolean][])('%j with env %j gives %s', async (argv, env, want) => {
    expect((await parse(argv, env)).kubeletInsecureTls).toBe(want);
  });

  it('refuses a boolean env twin that is not true/false', async () => {
    await expect(parse([], { PROBE_AGENT_GRPC_REFLECTION: 'maybe' })).rejects.toThrow(/want true or false/);
  });

  it('splits a comma-separated PROBE_AGENT_NETNS_DIR', async () => {
    const raw = await parse([], { PROBE_AGENT_NETNS_DIR: '/a/netns, /b/netns', HOST_IP: '192.0.2.7' });
    expect(parseRunConfig(raw, { HOST_IP: '192.0.2.7' }).netnsDirs).toEqual(['/a/netns', '/b/netns']);
  });
});

describe('kubeletClientOptions: the bearer token', () => {
  const cfg = (extra: Record<string, string> = {}) => parseRunConfig({ kubeletUrl: 'http://127.0.0.1:10255', ...extra }, {});
  function capture(): { log: ReturnType<typeof createLogger>; lines: Record<string, unknown>[] } {
    const lines: Record<string, unknown>[] = [];
    return { log: createLogger({ level: 'info', format: 'json', write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) }), lines };
  }
  const dir = mkdtempSync(join(tmpdir(), 'probe-agent-token-'));
  const present = join(dir, 'token');
  writeFileSync(present, 'abc');
  const absent = join(dir, 'absent');

  it('uses the configured file, whatever exists by default', () => {
    const { log, lines } = capture();
    expect(kubeletClientOptions(cfg({ kubeletTokenFile: '/etc/my-token' }), log, present).tokenFile).toBe('/etc/my-token');
    expect(lines).toEqual([]);
  });

  it('uses the default service-account token when it exists', () => {
    const { log, lines } = capture();
    expect(kubeletClientOptions(cfg(), log, present).tokenFile).toBe(present);
    expect(lines).toEqual([]);
  });

  it('goes without a token when none is configured and the default is missing, and says so once', () => {
    const { log, lines } = capture();
    const opts = kubeletClientOptions(cfg(), log, absent);
    expect(opts.tokenFile).toBeUndefined();
    expect(opts.url).toBe('http://127.0.0.1:10255');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 'info', tokenFile: absent });
    expect(String(lines[0]?.msg)).toMatch(/^no kubelet bearer token/);
  });
});
