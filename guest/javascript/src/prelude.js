// Spillway's JavaScript globals, set up before the user's script runs.
// Called once with the native functions (src/main.rs), at image build time
// when the image is pre-initialized (Wizer); returns `inspect`, which formats
// uncaught values, and `bind`, which each run calls with the text of
// /spillway/payloads.json and the user's arguments.
(function (native) {
  'use strict';
  const g = globalThis;
  const define = (name, value) =>
    Object.defineProperty(g, name, { value, writable: true, configurable: true, enumerable: false });

  // console formatting, roughly like Node: strings as they are at the top
  // level, errors with their stack, objects and arrays as JSON
  function replacer() {
    const seen = new WeakSet();
    return function (key, v) {
      if (typeof v === 'bigint') return `${v}n`;
      if (typeof v === 'function') return `[Function: ${v.name || '(anonymous)'}]`;
      if (typeof v === 'symbol') return v.toString();
      if (typeof v === 'number' && !Number.isFinite(v)) return String(v);
      if (v === undefined) return key === '' ? undefined : null;
      if (typeof v !== 'object' || v === null) return v;
      if (seen.has(v)) return '[Circular]';
      seen.add(v);
      if (v instanceof Error) return `${v.name}: ${v.message}`;
      if (v instanceof Map) return Object.fromEntries(v);
      if (v instanceof Set) return [...v];
      if (ArrayBuffer.isView(v) && !(v instanceof DataView)) return Array.from(v);
      return v;
    };
  }

  function inspect(v, top) {
    switch (typeof v) {
      case 'string':
        return top ? v : JSON.stringify(v);
      case 'undefined':
        return 'undefined';
      case 'number':
        return Object.is(v, -0) ? '-0' : String(v);
      case 'boolean':
        return String(v);
      case 'bigint':
        return `${v}n`;
      case 'symbol':
        return v.toString();
      case 'function':
        return `[Function: ${v.name || '(anonymous)'}]`;
    }
    if (v === null) return 'null';
    if (v instanceof Error) {
      const stack = typeof v.stack === 'string' ? v.stack.replace(/\n$/, '') : '';
      return stack ? `${v.name}: ${v.message}\n${stack}` : `${v.name}: ${v.message}`;
    }
    try {
      const s = JSON.stringify(v, replacer());
      return s === undefined ? String(v) : s;
    } catch (e) {
      return String(v);
    }
  }

  const format = (items) => items.map((v) => inspect(v, true)).join(' ') + '\n';
  const out = (...items) => native.write(1, format(items));
  const err = (...items) => native.write(2, format(items));
  const console = {
    log: out,
    info: out,
    debug: out,
    dir: (v) => native.write(1, inspect(v, false) + '\n'),
    error: err,
    warn: err,
    trace: (...items) => err('Trace:', ...items, '\n' + (new Error().stack || '').replace(/^.*\n/, '')),
    assert: (cond, ...items) => {
      if (!cond) err('Assertion failed' + (items.length ? ':' : ''), ...items);
    },
  };
  define('console', console);
  define('print', out);

  define('readText', function readText(path) {
    return native.readText(String(path));
  });

  define('readJSON', function readJSON(path) {
    const text = native.readText(String(path));
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new SyntaxError(`readJSON(${JSON.stringify(String(path))}): ${e.message}`);
    }
  });

  // A lazy iterator: the file is read in chunks, a batch of lines at a time.
  define('readLines', function readLines(path) {
    const handle = native.linesOpen(String(path));
    let batch = [];
    let i = 0;
    let done = false;
    const finish = () => {
      if (!done) {
        done = true;
        batch = [];
        native.linesClose(handle);
      }
      return { value: undefined, done: true };
    };
    return {
      [Symbol.iterator]() {
        return this;
      },
      next() {
        if (i < batch.length) return { value: batch[i++], done: false };
        if (done) return { value: undefined, done: true };
        batch = native.linesNext(handle);
        i = 0;
        if (batch === undefined) return finish();
        return { value: batch[i++], done: false };
      },
      return: finish,
    };
  });

  define('writeOut', function writeOut(name, text) {
    if (typeof text !== 'string') {
      text = typeof text === 'object' && text !== null ? JSON.stringify(text) : String(text);
    }
    return native.writeOut(String(name), text);
  });

  // a little of Node's `process`, for scripts written for Node
  const process = {
    argv: ['javascript', '/spillway/script'],
    env: {},
    exit: (code) => native.exit(code === undefined ? 0 : Number(code) | 0),
    stdout: { write: (s) => (native.write(1, String(s)), true) },
    stderr: { write: (s) => (native.write(2, String(s)), true) },
  };
  define('process', process);

  // per run: what this run was given
  function bind(payloadsText, argv) {
    define('payloads', JSON.parse(payloadsText));
    define('args', argv.slice());
    process.argv.push(...argv);
  }

  return { inspect, bind };
});
