/**
 * Root-only tests call requireRoot() at the top of the file: it throws, loudly, when the process is
 * not root or a needed command is missing, so such a test never passes (or skips) silently.
 */
import { execFileSync } from 'node:child_process';

/** Throws unless running as root with every command in `commands` on PATH. */
export function requireRoot(commands: string[] = ['ip', 'nft']): void {
  if (process.getuid?.() !== 0) {
    throw new Error('this test needs root (network namespaces, nftables): run `make test` as root');
  }
  const missing = commands.filter((c) => {
    try {
      execFileSync('sh', ['-c', `command -v ${c}`], { stdio: 'ignore' });
      return false;
    } catch {
      return true;
    }
  });
  if (missing.length > 0) {
    throw new Error(`this test needs ${missing.join(', ')} on PATH: run \`make test\`, which installs them`);
  }
}
