// Checks for the sandbox images in sandbox-images/, without Spillway's host.
//
//   node guest/test-images.mjs [jq|javascript|python ...]
//
// The preview1 modules (jq, javascript) run in Node's `node:wasi`, with the
// contract's preopens (/spillway, /payloads, /tmp, /out) mapped to temp dirs.
// The python component (WASI preview2) runs through jco: the first run installs
// @bytecodealliance/jco and preview2-shim from npm into sandbox-images/build/jco
// and transpiles python.wasm there (again whenever python.wasm changes).
// Or set SPILLWAY_TEST_HOST to a wasmtime host, a program called as
//   HOST WASM SPILLWAY_DIR PAYLOADS_DIR TMP_DIR OUT_DIR ARGV0 [ARGS...]
// that exits with the guest's exit code, such as guest/testhost (see README);
// then every image runs through it.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const imagesDir = path.resolve(here, '..', 'sandbox-images');
const host = process.env.SPILLWAY_TEST_HOST || '';
const only = process.argv.slice(2);

/** Child mode: run one preview1 module, exit with its exit code. */
async function runWasi([wasm, memFile, spillway, payloads, tmp, out, ...args]) {
  const { WASI } = await import('node:wasi');
  const wasi = new WASI({
    version: 'preview1',
    args,
    env: {},
    preopens: { '/spillway': spillway, '/payloads': payloads, '/tmp': tmp, '/out': out },
    stdin: fs.openSync('/dev/null', 'r'),
    returnOnExit: true,
  });
  const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasm), wasi.getImportObject());
  let code;
  try {
    code = wasi.start(instance);
  } catch (e) {
    process.stderr.write(`[test-images] trap: ${e.stack}\n`);
    code = 101;
  }
  fs.writeFileSync(memFile, String(instance.exports.memory.buffer.byteLength));
  process.exit(code);
}
if (process.argv[2] === '--run-wasi') await runWasi(process.argv.slice(3));

/** Child mode: run the transpiled python component with preview2-shim. */
async function runJco([jsDir, spillway, payloads, tmp, out, ...args]) {
  const { _setPreopens, types } = await import(path.join(jsDir, 'node_modules/@bytecodealliance/preview2-shim/dist/nodejs/filesystem.js'));
  // preview2-shim refuses open-at with the mutate-directory flag, which CPython's
  // adapter passes for every write (wasmtime accepts it): drop the flag.
  const openAt = types.Descriptor.prototype.openAt;
  types.Descriptor.prototype.openAt = function (pathFlags, p, openFlags, flags) {
    return openAt.call(this, pathFlags, p, openFlags, { ...flags, mutateDirectory: false });
  };
  const { _setArgs, _setEnv } = await import(path.join(jsDir, 'node_modules/@bytecodealliance/preview2-shim/dist/nodejs/cli.js'));
  _setPreopens({ '/spillway': spillway, '/payloads': payloads, '/tmp': tmp, '/out': out });
  _setArgs(args);
  _setEnv({});
  const component = await import(path.join(jsDir, 'python', 'python.js'));
  try {
    component.run.run(); // exit-with-code ends the process with the guest's code
  } catch (e) {
    process.stderr.write(`[test-images] trap: ${e && e.stack}\n`);
    process.exit(101);
  }
  process.exit(0);
}
if (process.argv[2] === '--run-jco') await runJco(process.argv.slice(3));

/** Install jco in sandbox-images/build/jco and transpile python.wasm (when it changed). */
function jcoSetup() {
  const dir = path.join(imagesDir, 'build', 'jco');
  fs.mkdirSync(dir, { recursive: true });
  const shimPkg = path.join(dir, 'node_modules/@bytecodealliance/preview2-shim/package.json');
  if (!fs.existsSync(shimPkg) || !fs.existsSync(path.join(dir, 'node_modules/.bin/jco'))) {
    console.log('     (installing @bytecodealliance/jco and preview2-shim from npm into sandbox-images/build/jco)');
    fs.writeFileSync(path.join(dir, 'package.json'), '{"private": true, "type": "module"}\n');
    const r = spawnSync('npm', ['install', '--no-audit', '--no-fund', '--silent', '@bytecodealliance/jco@1', '@bytecodealliance/preview2-shim@0.26'], { cwd: dir, stdio: 'inherit' });
    if (r.status !== 0) throw new Error('npm install of jco failed');
  }
  const wasm = path.join(imagesDir, 'python.wasm');
  const stamp = path.join(dir, 'python', '.source-mtime');
  const mtime = String(fs.statSync(wasm).mtimeMs);
  if (!fs.existsSync(stamp) || fs.readFileSync(stamp, 'utf8') !== mtime) {
    console.log('     (jco transpile python.wasm)');
    const r = spawnSync(path.join(dir, 'node_modules/.bin/jco'), ['transpile', wasm, '-o', path.join(dir, 'python'), '--no-typescript', '--quiet'], { stdio: 'inherit' });
    if (r.status !== 0) throw new Error('jco transpile failed');
    fs.writeFileSync(path.join(dir, 'python', 'package.json'), '{"type": "module"}\n');
    fs.writeFileSync(stamp, mtime);
  }
  return dir;
}
let jcoDir = null;

let seq = 0;
/** Lay out the contract's directories; payloads: [{name, text|file}] */
function layout(script, payloads) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'spillway-guest-'));
  const dirs = {};
  for (const d of ['spillway', 'payloads', 'tmp', 'out']) {
    dirs[d] = path.join(root, d);
    fs.mkdirSync(dirs[d]);
  }
  fs.writeFileSync(path.join(dirs.spillway, 'script'), script);
  const list = payloads.map((p) => {
    const id = `pl_${(++seq).toString(16).padStart(8, '0')}`;
    const dest = path.join(dirs.payloads, p.name);
    if (p.file) fs.linkSync(p.file, dest); // big test files: hard-linked, not copied (symlinks leave the preopen)
    else fs.writeFileSync(dest, p.text);
    fs.linkSync(dest, path.join(dirs.payloads, id));
    const size = fs.statSync(dest).size;
    const contentType = p.contentType || (p.name.endsWith('.json') ? 'application/json' : 'text/plain');
    return { id, name: p.name, path: `/payloads/${p.name}`, size, contentType };
  });
  fs.writeFileSync(path.join(dirs.spillway, 'payloads.json'), JSON.stringify(list));
  return { root, dirs, list };
}

/** Run an image; returns {code, stdout, stderr, out: {name: text}, memory} */
async function run(image, { script, payloads = [], args = [] }) {
  const { root, dirs, list } = layout(script, payloads);
  const outFile = path.join(root, 'stdout');
  const errFile = path.join(root, 'stderr');
  let code;
  let memory = null;
  const started = process.hrtime.bigint();
  if (image === 'python' && !host) {
    jcoDir ??= jcoSetup();
    // componentize-py's core modules use extended-const, behind a flag in Node 20
    const r = spawnSync(process.execPath, ['--no-warnings', '--experimental-wasm-extended-const', '--stack-size=4000', fileURLToPath(import.meta.url), '--run-jco', jcoDir, dirs.spillway, dirs.payloads, dirs.tmp, dirs.out, image, ...args], {
      stdio: ['ignore', fs.openSync(outFile, 'w'), fs.openSync(errFile, 'w')],
    });
    code = r.status ?? `signal ${r.signal}`;
  } else if (host) {
    const r = spawnSync(host, [path.join(imagesDir, `${image}.wasm`), dirs.spillway, dirs.payloads, dirs.tmp, dirs.out, image, ...args], {
      stdio: ['ignore', fs.openSync(outFile, 'w'), fs.openSync(errFile, 'w')],
    });
    code = r.status;
  } else {
    // One child process per run, so a crash can't take the runner down. Node 20's
    // V8 corrupts its heap when a concurrent GC runs during a big wasm memory.grow
    // ("Unknown type: 512", SIGSEGV, with payloads of ~30 MB): --single-threaded-gc.
    // --stack-size: a 4 MB native stack, like a host's max_wasm_stack (see README).
    const memFile = path.join(root, 'memory');
    const r = spawnSync(process.execPath, ['--no-warnings', '--single-threaded-gc', '--stack-size=4000', fileURLToPath(import.meta.url), '--run-wasi', path.join(imagesDir, `${image}.wasm`), memFile, dirs.spillway, dirs.payloads, dirs.tmp, dirs.out, image, ...args], {
      stdio: ['ignore', fs.openSync(outFile, 'w'), fs.openSync(errFile, 'w')],
    });
    code = r.status ?? `signal ${r.signal}`;
    if (fs.existsSync(memFile)) memory = Number(fs.readFileSync(memFile, 'utf8'));
  }
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  const out = {};
  for (const f of fs.readdirSync(dirs.out)) out[f] = fs.readFileSync(path.join(dirs.out, f), 'utf8');
  const result = {
    code,
    stdout: fs.readFileSync(outFile, 'utf8'),
    stderr: fs.readFileSync(errFile, 'utf8'),
    out,
    memory,
    ms,
    payloads: list,
  };
  fs.rmSync(root, { recursive: true, force: true });
  return result;
}

const mib = (bytes) => (bytes === null ? '? MiB' : `${Math.round(bytes / 2 ** 20)} MiB`);

let passed = 0;
let failed = 0;
async function test(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}\n${String(e.stack || e).replace(/^/gm, '     ')}`);
  }
}

function expect(r, code, stdout) {
  const show = `exit ${r.code}\n--- stdout\n${r.stdout.slice(0, 2000)}\n--- stderr\n${r.stderr.slice(0, 2000)}`;
  assert.equal(r.code, code, `exit code\n${show}`);
  if (stdout !== undefined) assert.equal(r.stdout, stdout, `stdout\n${show}`);
}

// A file of many lines, created once, for the big-input tests.
let bigFile = null;
function bigNdjson() {
  if (bigFile) return bigFile;
  bigFile = path.join(os.tmpdir(), `spillway-guest-big-${process.pid}.ndjson`);
  const fd = fs.openSync(bigFile, 'w');
  const users = ['ann', 'bob', 'cy', 'dee'];
  let chunk = [];
  let bytes = 0;
  for (let i = 0; bytes < 50e6; i++) {
    const line = JSON.stringify({ i, user: users[i % 4], amount: i % 100, note: 'lorem ipsum dolor sit amet, consectetur' }) + '\n';
    chunk.push(line);
    bytes += line.length;
    if (chunk.length === 10000) {
      fs.writeSync(fd, chunk.join(''));
      chunk = [];
    }
  }
  fs.writeSync(fd, chunk.join(''));
  fs.closeSync(fd);
  return bigFile;
}
process.on('exit', () => bigFile && fs.rmSync(bigFile, { force: true }));

const sales = [
  { user: 'ann', amount: 3 },
  { user: 'bob', amount: 5 },
  { user: 'ann', amount: 4 },
];
const ndjson = sales.map((s) => JSON.stringify(s)).join('\n') + '\n';
const groupSum = 'group_by(.user) | map({user: .[0].user, total: (map(.amount) | add)}) | .[]';

async function jqTests() {
  const jq = (script, payloads, args) => run('jq', { script, payloads, args });
  await test('jq: group by and sum over NDJSON (-s)', async () => {
    const r = await jq(groupSum, [{ name: 'sales.ndjson', text: ndjson }], ['-s']);
    expect(r, 0, '{"user":"ann","total":7}\n{"user":"bob","total":5}\n');
  });
  await test('jq: group by and sum over a JSON array', async () => {
    const r = await jq(groupSum, [{ name: 'sales.json', text: JSON.stringify(sales, null, 2) }]);
    expect(r, 0, '{"user":"ann","total":7}\n{"user":"bob","total":5}\n');
  });
  await test('jq: payloads in order form one input stream', async () => {
    const r = await jq('.a', [
      { name: 'one.json', text: '{"a":1} {"a":2}' },
      { name: 'two.json', text: '{"a":3}\n' },
    ]);
    expect(r, 0, '1\n2\n3\n');
  });
  await test('jq: input_filename is the payload name', async () => {
    const r = await jq('input_filename', [{ name: 'x.json', text: '1' }, { name: 'y.json', text: '2' }], ['-r']);
    expect(r, 0, 'x.json\ny.json\n');
  });
  await test('jq: -r / --raw-output, compact by default', async () => {
    const payloads = [{ name: 'd.json', text: '{"s":"a\\"b","o":{"k":[1,2]}}' }];
    expect(await jq('.s', payloads, ['-r']), 0, 'a"b\n');
    expect(await jq('.s', payloads, ['--raw-output']), 0, 'a"b\n');
    expect(await jq('.s', payloads), 0, '"a\\"b"\n');
    expect(await jq('.o', payloads), 0, '{"k":[1,2]}\n');
    expect(await jq('.o', payloads, ['-c']), 0, '{"k":[1,2]}\n');
  });
  await test('jq: -R each line is a string (last line without newline too)', async () => {
    const r = await jq('.', [{ name: 'a.txt', text: 'x\ny\n' }, { name: 'b.txt', text: 'z' }], ['-R']);
    expect(r, 0, '"x"\n"y"\n"z"\n');
    expect(await jq('length', [{ name: 'a.txt', text: 'ab\n' }], ['--raw-input']), 0, '2\n');
  });
  await test('jq: -s slurps every payload into one array; -Rs into one string', async () => {
    const payloads = [{ name: 'a.json', text: '1 2' }, { name: 'b.json', text: '[3]' }];
    expect(await jq('.', payloads, ['-s']), 0, '[1,2,[3]]\n');
    expect(await jq('.', payloads, ['--slurp']), 0, '[1,2,[3]]\n');
    expect(await jq('.', [{ name: 'a.txt', text: 'x\ny\n' }, { name: 'b.txt', text: 'z' }], ['-Rs']), 0, '"x\\ny\\nz"\n');
  });
  await test('jq: -n runs once on null; inputs reads the stream; -nR [inputs] reads every line', async () => {
    expect(await jq('.', [{ name: 'a.json', text: '1' }], ['-n']), 0, 'null\n');
    expect(await jq('[inputs] | add', [{ name: 'a.json', text: '1 2' }, { name: 'b.json', text: '3' }], ['--null-input']), 0, '6\n');
    expect(await jq('[inputs]', [{ name: 'a.txt', text: 'p\nq\n' }, { name: 'b.txt', text: 'r\n' }], ['-nR']), 0, '["p","q","r"]\n');
    expect(await jq('input', [{ name: 'a.json', text: '7 8' }], ['-n']), 0, '7\n');
  });
  await test('jq: -j / --join-output', async () => {
    const payloads = [{ name: 'a.json', text: '"a" 1 "b"' }];
    expect(await jq('.', payloads, ['-j']), 0, 'a1b');
    expect(await jq('.', payloads, ['--join-output']), 0, 'a1b');
  });
  await test('jq: --arg and --argjson, $ARGS', async () => {
    const r = await jq('[$x, $y.k, $ARGS.named.x]', [], ['-n', '--arg', 'x', 'hi', '--argjson', 'y', '{"k":[1]}']);
    expect(r, 0, '["hi",[1],"hi"]\n');
    expect(await jq('$ARGS.positional', [], ['-n', '--args', 'a', 'b']), 0, '["a","b"]\n');
  });
  await test('jq: combined short flags -rc, -nr, -sc', async () => {
    expect(await jq('.[0]', [{ name: 'a.json', text: '["s"]' }], ['-rc']), 0, 's\n');
    expect(await jq('"t"', [], ['-nr']), 0, 't\n');
    expect(await jq('length', [{ name: 'a.json', text: '1 2 3' }], ['-sc']), 0, '3\n');
  });
  await test('jq: --indent, -S', async () => {
    expect(await jq('.', [{ name: 'a.json', text: '{"b":1,"a":[2]}' }], ['--indent', '2', '-S']), 0, '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n');
  });
  await test('jq: a payload named on the command line is the only input', async () => {
    const payloads = [{ name: 'a.json', text: '1' }, { name: 'b.json', text: '2' }];
    expect(await jq('.', payloads, ['b.json']), 0, '2\n');
    const r = await jq('.', payloads, ['.foo']);
    expect(r, 2);
    assert.match(r.stderr, /not found under \/payloads/);
  });
  await test('jq: unknown flags exit 2 naming the flag', async () => {
    let r = await jq('.', [], ['--frobnicate']);
    expect(r, 2, '');
    assert.match(r.stderr, /unknown option: --frobnicate/);
    r = await jq('.', [], ['-rX']);
    expect(r, 2, '');
    assert.match(r.stderr, /unknown option: -X/);
    r = await jq('.', [], ['--arg', 'x']);
    expect(r, 2, '');
    assert.match(r.stderr, /--arg takes/);
  });
  await test('jq: a filter that does not compile exits 3 with position', async () => {
    let r = await jq('.a | map(', [{ name: 'a.json', text: '{}' }]);
    expect(r, 3, '');
    assert.match(r.stderr, /line 1, column/);
    r = await jq('.a |\n  frob(1)', [{ name: 'a.json', text: '{}' }]);
    expect(r, 3, '');
    assert.match(r.stderr, /undefined function frob\/1 at line 2, column 3/);
    r = await jq('$nope', [{ name: 'a.json', text: '{}' }]);
    expect(r, 3, '');
    assert.match(r.stderr, /undefined variable/);
  });
  await test('jq: runtime errors exit 1, the other inputs are still processed', async () => {
    const r = await jq('.a + 1', [{ name: 'd.json', text: '{"a":1} {"a":"x"} {"a":2}' }]);
    expect(r, 1, '2\n3\n');
    assert.match(r.stderr, /^jq: error \(at d.json\): cannot calculate "x" \+ 1/m);
    const e = await jq('error("boom")', [{ name: 'd.json', text: '1' }]);
    expect(e, 1, '');
    assert.equal(e.stderr, 'jq: error (at d.json): boom\n');
  });
  await test('jq: bad input JSON exits 1 naming payload, line and column', async () => {
    const r = await jq('.', [{ name: 'd.ndjson', text: '{"a":1}\n{"a":\n' }]);
    expect(r, 1, '{"a":1}\n');
    assert.match(r.stderr, /payload d.ndjson: invalid JSON .*line 3/);
  });
  await test('jq: halt_error keeps jq exit code 5; halt exits 0', async () => {
    const r = await jq('"bye\\n" | halt_error', [], ['-n']);
    expect(r, 5, '');
    assert.equal(r.stderr, 'bye\n');
    expect(await jq('1, halt, 2', [], ['-n']), 0, '1\n');
  });
  await test('jq: -e', async () => {
    expect(await jq('false', [], ['-ne']), 1, 'false\n');
    expect(await jq('empty', [], ['-ne']), 4, '');
  });
  await test('jq: debug and stderr write to stderr', async () => {
    const r = await jq('debug | stderr | empty', [], ['-n']);
    expect(r, 0, '');
    assert.equal(r.stderr, '["DEBUG:",null]\nnull');
  });
  await test('jq: no environment: $ENV is {}', async () => {
    expect(await jq('$ENV', [], ['-n']), 0, '{}\n');
  });
  await test('jq: 50 MB NDJSON, group by and sum with reduce (streamed, small memory)', async () => {
    const r = await jq('reduce inputs as $x ({}; .[$x.user] += $x.amount)', [{ name: 'big.ndjson', file: bigNdjson() }], ['-n']);
    expect(r, 0);
    const totals = JSON.parse(r.stdout);
    assert.deepEqual(Object.keys(totals).sort(), ['ann', 'bob', 'cy', 'dee']);
    console.log(`     (${Math.round(r.ms)} ms, ${mib(r.memory)} of wasm memory)`);
  });
  await test('jq: 50 MB NDJSON, count with -c', async () => {
    const r = await jq('select(.user == "ann") | .i', [{ name: 'big.ndjson', file: bigNdjson() }], ['-c']);
    expect(r, 0);
    assert.ok(r.stdout.split('\n').length > 100000);
    console.log(`     (${Math.round(r.ms)} ms, ${r.stdout.length} bytes out)`);
  });
}

async function main() {
  const want = (name) => only.length === 0 || only.includes(name);
  for (const [name, tests] of [['jq', jqTests], ['javascript', jsTests], ['python', pyTests]]) {
    if (!want(name)) continue;
    if (!fs.existsSync(path.join(imagesDir, `${name}.wasm`))) {
      console.log(`skip ${name}: sandbox-images/${name}.wasm not built (make images)`);
      continue;
    }
    await tests();
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exitCode = failed ? 1 : 0;
}


async function jsTests() {
  const js = (script, payloads = [], args = []) => run('javascript', { script, payloads, args });
  await test('js: console.log formatting, print, args', async () => {
    const r = await js(
      'console.log("s", 1, -0, true, null, undefined, 10n, [1, "a"], {k: {n: 2}}, new Map([["m", 1]]), new Set([3]));\n' +
        'print("p", args);',
      [],
      ['x', 'y'],
    );
    expect(r, 0, 's 1 -0 true null undefined 10n [1,"a"] {"k":{"n":2}} {"m":1} [3]\np ["x","y"]\n');
  });
  await test('js: console.error goes to stderr', async () => {
    const r = await js('console.error("bad", {a: 1}); console.warn("w"); console.log("ok");');
    expect(r, 0, 'ok\n');
    assert.equal(r.stderr, 'bad {"a":1}\nw\n');
  });
  await test('js: payloads global, readText, readJSON, payloads reachable by id', async () => {
    const r = await js(
      'const p = payloads[0];\n' +
        'console.log(p.name, p.path, p.size, p.contentType, p.id.startsWith("pl_"));\n' +
        'console.log(readText(p.path).length, readJSON(p.path).a, readJSON("/payloads/" + p.id).a);',
      [{ name: 'data.json', text: '{"a": 42}' }],
    );
    expect(r, 0, 'data.json /payloads/data.json 9 application/json true\n9 42 42\n');
  });
  await test('js: readJSON on bad JSON throws a SyntaxError naming the file (exit 1)', async () => {
    const r = await js('readJSON("/payloads/bad.json")', [{ name: 'bad.json', text: '{nope' }]);
    expect(r, 1, '');
    assert.match(r.stderr, /^Uncaught SyntaxError: readJSON\("\/payloads\/bad.json"\)/);
  });
  await test('js: readText of a missing file throws', async () => {
    const r = await js('try { readText("/payloads/none") } catch (e) { console.log(e.message) }');
    expect(r, 0, 'readText: /payloads/none: No such file or directory\n');
  });
  await test('js: readLines yields lines without \\n or \\r\\n, for...of and spread', async () => {
    const r = await js(
      'const n = []; for (const l of readLines("/payloads/a.txt")) n.push(l);\n' +
        'console.log(JSON.stringify(n), [...readLines("/payloads/b.txt")].length);',
      [{ name: 'a.txt', text: 'one\r\ntwo\n\nthree' }, { name: 'b.txt', text: '' }],
    );
    expect(r, 0, '["one","two","","three"] 0\n');
  });
  await test('js: readLines is lazy: break early; 50 MB streamed in little memory', async () => {
    const r = await js(
      'let i = 0; for (const l of readLines(payloads[0].path)) { if (++i === 3) break; }\n' +
        'let n = 0, total = 0; for (const l of readLines(payloads[0].path)) { n++; total += JSON.parse(l).amount; }\n' +
        'console.log(i, n, total);',
      [{ name: 'big.ndjson', file: bigNdjson() }, { name: 'big2.ndjson', file: bigNdjson() }, { name: 'big3.ndjson', file: bigNdjson() }, { name: 'big4.ndjson', file: bigNdjson() }],
    );
    expect(r, 0);
    const [i, n] = r.stdout.trim().split(' ').map(Number);
    assert.equal(i, 3);
    assert.ok(n > 500000, `${n} lines`);
    if (r.memory !== null) assert.ok(r.memory < 64 * 2 ** 20, `wasm memory ${r.memory}`);
    console.log(`     (${Math.round(r.ms)} ms for ${n} lines of 50 MB, ${mib(r.memory)} of wasm memory)`);
  });
  await test('js: a 200 MB file is not loaded: readLines over all four links of it', async () => {
    const r = await js(
      'let n = 0; for (const p of payloads) for (const l of readLines(p.path)) n++;\nconsole.log(n);',
      [{ name: 'a.ndjson', file: bigNdjson() }, { name: 'b.ndjson', file: bigNdjson() }, { name: 'c.ndjson', file: bigNdjson() }, { name: 'd.ndjson', file: bigNdjson() }],
    );
    expect(r, 0);
    if (r.memory !== null) assert.ok(r.memory < 64 * 2 ** 20, `wasm memory ${r.memory}`);
    console.log(`     (${Math.round(r.ms)} ms, ${mib(r.memory)} of wasm memory)`);
  });
  await test('js: writeOut writes /out/<name>, rejects / and ..', async () => {
    const r = await js(
      'console.log(writeOut("r.txt", "hello"), writeOut("o.json", {a: 1}));\n' +
        'for (const bad of ["../x", "a/b", "..", ""]) { try { writeOut(bad, "x"); console.log("wrote", bad); } catch (e) { console.log(e.name); } }',
    );
    expect(r, 0, '/out/r.txt /out/o.json\nTypeError\nTypeError\nTypeError\nTypeError\n');
    assert.deepEqual(r.out, { 'r.txt': 'hello', 'o.json': '{"a":1}' });
  });
  await test('js: uncaught exception: "Uncaught <Name>: <message>" and stack, exit 1', async () => {
    const r = await js('console.log("before");\nfunction f() { throw new RangeError("too far"); }\nf();');
    expect(r, 1, 'before\n');
    assert.match(r.stderr, /^Uncaught RangeError: too far\n\s+at f \(\/spillway\/script:2:/);
    const s = await js('throw "plain"');
    expect(s, 1, '');
    assert.equal(s.stderr, 'Uncaught "plain"\n');
  });
  await test('js: syntax error exits 3 with position', async () => {
    const r = await js('console.log("never");\nlet x = (1 + ;');
    expect(r, 3, '');
    assert.match(r.stderr, /^SyntaxError: .*\n\s+at \/spillway\/script:2:/);
  });
  await test('js: a SyntaxError thrown at run time (JSON.parse) exits 1, not 3', async () => {
    const r = await js('JSON.parse("{")');
    expect(r, 1, '');
    assert.match(r.stderr, /^Uncaught SyntaxError/);
  });
  await test('js: promises and async functions run; unhandled rejections exit 1', async () => {
    expect(await js('(async () => { await null; console.log("a"); })(); Promise.resolve(2).then(console.log);'), 0, 'a\n2\n');
    const r = await js('Promise.reject(new Error("nope"));');
    expect(r, 1, '');
    assert.match(r.stderr, /^Uncaught \(in promise\) Error: nope/);
    expect(await js('Promise.reject(new Error("x")).catch(() => console.log("caught"));'), 0, 'caught\n');
    const t = await js('(async () => { await null; throw new TypeError("late"); })();');
    expect(t, 1, '');
    assert.match(t.stderr, /TypeError: late/);
  });
  await test('js: ES2023 features', async () => {
    const r = await js('console.log([3,1,2].toSorted().join(), [1,2,3].findLast(x => x < 3), [1,2].at(-1), Object.hasOwn({a:1}, "a"), "x".replaceAll("x", "y"), /(?<y>\\d{4})/.exec("in 2023").groups.y, 2n ** 64n);');
    expect(r, 0, '1,2,3 2 2 true y 2023 18446744073709551616n\n');
  });
  await test('js: process.exit(n), process.argv, no environment', async () => {
    const r = await js('console.log(process.argv.slice(2), JSON.stringify(process.env)); process.exit(7); console.log("no");', [], ['u']);
    expect(r, 7, '["u"] {}\n');
  });
  // Needs a 4 MiB native stack (node --stack-size=4000 here; max_wasm_stack in a host).
  await test('js: deep recursion is a RangeError, not a crash', async () => {
    const r = await js('function f(n) { return n === 0 ? 0 : 1 + f(n - 1); }\nconsole.log(f(2000));\ntry { f(1e7) } catch (e) { console.log(e.name) }');
    expect(r, 0, '2000\nRangeError\n');
  });
  await test('js: stdout is buffered and flushed at exit (100k lines)', async () => {
    const r = await js('for (let i = 0; i < 100000; i++) console.log(i);');
    expect(r, 0);
    assert.equal(r.stdout.split('\n').length, 100001);
  });
}

async function pyTests() {
  const py = (script, payloads = [], args = []) => run('python', { script, payloads, args });
  await test('python: print, sys.argv, no environment', async () => {
    const r = await py('import sys, os\nprint("hi", sys.argv, dict(os.environ), __name__)', [], ['a', 'b']);
    expect(r, 0, "hi ['script', 'a', 'b'] {} __main__\n");
  });
  await test('python: spillway module and open() on /payloads (by name and id)', async () => {
    const r = await py(
      'import spillway, json\np = spillway.payloads[0]\n' +
        'print(p["name"], p["path"], p["size"], p["content_type"], p["id"].startswith("pl_"))\n' +
        'print(spillway.read_json(p["path"])["a"], json.load(open("/payloads/" + p["id"]))["a"], len(spillway.read_text(p["path"])))',
      [{ name: 'data.json', text: '{"a": 42}' }],
    );
    expect(r, 0, 'data.json /payloads/data.json 9 application/json True\n42 42 9\n');
  });
  await test('python: read_lines is lazy, strips \\n and \\r\\n; write_out', async () => {
    const r = await py(
      'import spillway\nprint(list(spillway.read_lines("/payloads/a.txt")))\n' +
        'n = 0\nfor line in spillway.read_lines(spillway.payloads[1]["path"]):\n    n += 1\nprint(n > 500000)\n' +
        'print(spillway.write_out("r.txt", "hello"), spillway.write_out("o.json", {"a": 1}))\n' +
        'for bad in ["../x", "a/b", ""]:\n    try:\n        spillway.write_out(bad, "x")\n    except ValueError as e:\n        print("rejected")',
      [{ name: 'a.txt', text: 'one\r\ntwo\n\nthree' }, { name: 'big.ndjson', file: bigNdjson() }],
    );
    expect(r, 0, "['one', 'two', '', 'three']\nTrue\n/out/r.txt /out/o.json\nrejected\nrejected\nrejected\n");
    assert.deepEqual(r.out, { 'r.txt': 'hello', 'o.json': '{"a": 1}' });
    console.log(`     (${Math.round(r.ms)} ms)`);
  });
  await test('python: group by and sum over NDJSON', async () => {
    const r = await py(
      'import json, collections, spillway\nt = collections.Counter()\n' +
        'for line in spillway.read_lines("/payloads/s.ndjson"):\n    r = json.loads(line)\n    t[r["user"]] += r["amount"]\n' +
        'print(json.dumps(dict(sorted(t.items()))))',
      [{ name: 's.ndjson', text: ndjson }],
    );
    expect(r, 0, '{"ann": 7, "bob": 5}\n');
  });
  await test('python: uncaught exception: traceback on stderr, exit 1', async () => {
    const r = await py('print("before")\ndef f():\n    raise KeyError("k")\nf()');
    expect(r, 1, 'before\n');
    assert.match(r.stderr, /^Traceback \(most recent call last\):\n  File "\/spillway\/script", line 4, in <module>\n/);
    assert.match(r.stderr, /KeyError: 'k'\n$/);
    assert.doesNotMatch(r.stderr, /spillway_runner/);
  });
  await test('python: syntax error exits 3 with the message and position', async () => {
    const r = await py('print("never")\nx = (1 +\n');
    expect(r, 3, '');
    assert.match(r.stderr, /File "\/spillway\/script", line 2/);
    assert.match(r.stderr, /SyntaxError: /);
  });
  await test('python: SystemExit(n), sys.exit("msg"), exit 0', async () => {
    expect(await py('import sys\nprint("x")\nsys.exit(4)'), 4, 'x\n');
    const m = await py('import sys\nsys.exit("bad input")');
    expect(m, 1, '');
    assert.equal(m.stderr, 'bad input\n');
    expect(await py('raise SystemExit'), 0, '');
    expect(await py('import sys\nsys.exit(0)'), 0, '');
  });
  await test('python: stdout is buffered, and flushed on success, exceptions and exits', async () => {
    const ok = await py('for i in range(200000):\n    print(i)');
    expect(ok, 0);
    assert.equal(ok.stdout.split('\n').length, 200001);
    const err = await py('print("a")\nprint("é ✓")\nraise ValueError("v")');
    expect(err, 1, 'a\né ✓\n');
    expect(await py('import sys\nprint("b")\nsys.exit(2)'), 2, 'b\n');
    console.log(`     (200,000 lines: ${Math.round(ok.ms)} ms)`);
  });
  await test('python: fresh randomness per run', async () => {
    const a = await py('import random\nprint(random.random())');
    const b = await py('import random\nprint(random.random())');
    expect(a, 0);
    assert.notEqual(a.stdout, b.stdout);
  });
  await test('python: stdlib (dataclasses in __main__, decimal, zoneinfo-free datetime, re, csv, statistics)', async () => {
    const r = await py(
      'from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n' +
        'import decimal, datetime, re, csv, io, statistics, itertools, hashlib, gzip, textwrap, difflib, unicodedata\n' +
        'print(P(1), decimal.Decimal("0.1") * 3, datetime.date(2024, 2, 29).isoformat(), re.sub(r"\\d", "#", "a1b2"),\n' +
        '      next(csv.reader(io.StringIO("a,b"))), statistics.median([3, 1, 2]), hashlib.sha256(b"").hexdigest()[:8])',
    );
    expect(r, 0, "P(x=1) 0.3 2024-02-29 a#b# ['a', 'b'] 2 e3b0c442\n");
  });
}

await main();
