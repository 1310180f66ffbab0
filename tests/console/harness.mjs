// The console test harness: the real `spillway` binary on free loopback
// ports with a temp data dir and a fixed cast of tokens, seeded through the
// real CLI; and Chromium (Debian's, through playwright-core).
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, rmSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const modules = process.env.CONSOLE_NODE_MODULES;
if (!modules) throw new Error('CONSOLE_NODE_MODULES is not set: run the suite with `make test-console`, which installs playwright-core and axe-core');
const require = createRequire(path.join(modules, 'package.json'));
export const { chromium } = require('playwright-core');
export const axeSource = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');

export const BIN = process.env.CONSOLE_SPILLWAY_BIN || 'target/debug/spillway';

/// Tokens of the cast: [token, principal, tenant, roles].
export const CAST = [
  ['tok-carol', 'carol', 'acme', ['compliance']],
  ['tok-alice', 'alice', 'acme', ['agent']],
  ['tok-audrey', 'audrey', 'acme', ['auditor']],
  ['tok-mallory', 'mallory', 'other', ['agent', 'admin']],
];

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/// Starts `spillway serve` with the console on; `console` adds keys to the
/// [console] section.
export async function startServer(consoleKeys = {}) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'spillway-console-'));
  const [grpcPort, webPort] = [await freePort(), await freePort()];
  const tokens = CAST.map(([token, principal, tenant, roles]) =>
    `[[auth.tokens]]\ntoken = "${token}"\nprincipal = "${principal}"\ntenant = "${tenant}"\nroles = [${roles.map((r) => `"${r}"`).join(', ')}]\n`).join('\n');
  const extra = Object.entries(consoleKeys).map(([k, v]) => `${k} = ${JSON.stringify(v)}\n`).join('');
  const config = `listen = "127.0.0.1:${grpcPort}"\ndata_dir = ${JSON.stringify(path.join(dir, 'data'))}\n\n[console]\nlisten = "127.0.0.1:${webPort}"\n${extra}\n${tokens}`;
  writeFileSync(path.join(dir, 'spillway.toml'), config);
  const log = [];
  const base = `http://127.0.0.1:${webPort}`;
  let child;
  // Starts the server over the same config and data directory, and waits
  // for its console.
  const up = async () => {
    child = spawn(BIN, ['serve', '--config', path.join(dir, 'spillway.toml')], {
      // Only this config: no SPILLWAY_* variable of the caller's leaks in.
      env: { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SPILLWAY_'))), RUST_LOG: 'warn' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout.on('data', (d) => log.push(String(d)));
    child.stderr.on('data', (d) => log.push(String(d)));
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`spillway serve exited with ${child.exitCode}:\n${log.join('')}`);
      try {
        const r = await fetch(`${base}/signin`);
        if (r.status === 200) break;
      } catch { /* not listening yet */ }
      if (Date.now() > deadline) throw new Error(`the console did not answer within 60 s:\n${log.join('')}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  };
  const down = async () => {
    child.kill('SIGTERM');
    await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
  };
  await up();
  return {
    base,
    grpc: `127.0.0.1:${grpcPort}`,
    dir,
    log,
    cli(token, ...args) {
      const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SPILLWAY_')));
      const out = execFileSync(BIN, ['--addr', this.grpc, '--token', token, '--json', ...args], { encoding: 'utf8', env });
      return JSON.parse(out);
    },
    async stop() {
      await down();
      rmSync(dir, { recursive: true, force: true });
    },
    /// Stops the server (SIGTERM) and starts it again on the same data.
    async restart() {
      await down();
      await up();
    },
    file(name, text) {
      mkdirSync(path.join(dir, 'files'), { recursive: true });
      const p = path.join(dir, 'files', name);
      writeFileSync(p, text);
      return p;
    },
  };
}

export async function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      // No --user-data-dir here: playwright refuses it in launch(), and
      // gives every launch a fresh temporary profile directory itself.
    ],
  });
}

/// Signs in through the form; returns the page.
export async function signIn(context, base, token) {
  const page = await context.newPage();
  await page.goto(`${base}/signin`);
  await page.getByLabel('Bearer token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL(`${base}/overview`);
  return page;
}

/// axe-core on the current page: the serious and critical violations.
export async function axe(page) {
  await page.evaluate(axeSource);
  const result = await page.evaluate(async () => (await globalThis.axe.run(document, { resultTypes: ['violations'] })).violations);
  return result
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id} (${v.impact}): ${v.help} at ${v.nodes.map((n) => n.target.join(' ')).slice(0, 3).join(', ')}`);
}
