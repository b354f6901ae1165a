#!/usr/bin/env node
// The HTTP door (docs/http.md) driven by the official `openai` npm package, the real SDK: models,
// completions and chat (plain and streamed, json_schema), errors as the SDK's typed exceptions,
// overload answered 429 and the SDK's own retry honouring retry-after-ms, and the Batch API.
//
//     node tests/node/test_openai_sdk.mjs --binary build/switchyard --models ../shared/models
//
// Needs `npm ci` in tests/node (scripts/install-deps.sh runs it). SY_CASE=name runs the cases
// whose name contains it. Standard Node modules plus the SDK only.

import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { performance } from 'node:perf_hooks';
import OpenAI, {
  AuthenticationError,
  BadRequestError,
  NotFoundError,
  RateLimitError,
  toFile,
} from 'openai';

// ---- arguments, reference ----------------------------------------------------------------------

function parseArgs() {
  const a = process.argv.slice(2);
  const out = {};
  for (let i = 0; i + 1 < a.length; i += 2) out[a[i].replace(/^-+/, '')] = a[i + 1];
  if (!out.binary || !out.models) {
    console.error('usage: test_openai_sdk.mjs --binary build/switchyard --models ../shared/models');
    process.exit(2);
  }
  return out;
}

const A = parseArgs();
const STORIES = path.join(A.models, 'stories260K.gguf');
const ZOO = path.join(A.models, 'zoo', 'zoo-qwen2-f32.gguf');
const REF = JSON.parse(fs.readFileSync(path.join(A.models, 'reference-llamacpp.json'), 'utf8'))
  .cases;

function ref(prompt, n) {
  const c = REF.find((x) => x.prompt === prompt && x.n_predict === n);
  if (!c) throw new Error(`no llama.cpp reference for ${JSON.stringify(prompt)} / ${n}`);
  return c;
}

// llama2.c's tokenizer file (tok512.bin, the same vocabulary as stories260K.gguf): an int32
// max_token_length, then per token a float32 score, an int32 length and the piece's bytes.
// A piece <0xHH> is that byte. Used to cut the llama.cpp reference at 16 tokens.
function loadPieces(file) {
  const b = fs.readFileSync(file);
  const pieces = [];
  let o = 4;
  while (o < b.length) {
    const n = b.readInt32LE(o + 4);
    o += 8;
    pieces.push(b.subarray(o, o + n));
    o += n;
  }
  return pieces;
}

function detokenize(pieces, ids) {
  const parts = ids.map((id) => {
    const p = pieces[id];
    const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(p.toString('latin1'));
    return m ? Buffer.from([parseInt(m[1], 16)]) : p;
  });
  return Buffer.concat(parts).toString('utf8');
}

const PIECES = loadPieces(path.join(A.models, 'tok512.bin'));
const ONCE = ref('Once upon a time', 32);
// The decoder must reproduce the reference's own texts before its 16-token cut is trusted.
for (const c of REF)
  assert.equal(detokenize(PIECES, c.generated_token_ids), c.generated_text, 'tok512 decoding');
const ONCE16 = detokenize(PIECES, ONCE.generated_token_ids.slice(0, 16));
assert.ok(ONCE.generated_text.startsWith(ONCE16) && ONCE16.length > 0, 'a prefix');

// ---- servers -----------------------------------------------------------------------------------

const SERVERS = new Set(); // running
const STARTED = []; // every one started, for the logs of a failure

class Server {
  // A `switchyard serve` child with the HTTP door and /metrics on free loopback ports.
  static async start(model, { extra = [], config = null, journal = false } = {}) {
    const s = new Server();
    s.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sy-node-'));
    s.logPath = path.join(s.dir, 'server.log');
    const cmd = ['serve', '--model', model, '--backend', 'cpu', '--bind', 'tcp://127.0.0.1:*',
      '--http', '127.0.0.1:0', '--metrics', '127.0.0.1:0', '--threads', '1'];
    if (journal) cmd.push('--journal', path.join(s.dir, 'journal', 'switchyard.journal'));
    else cmd.push('--no-journal');
    if (config) {
      const p = path.join(s.dir, 'config.yaml');
      fs.writeFileSync(p, config);
      cmd.push('--config', p);
    }
    cmd.push(...extra);
    if (journal) fs.mkdirSync(path.join(s.dir, 'journal'));
    s.cmd = [A.binary, ...cmd].join(' ');
    const log = fs.openSync(s.logPath, 'w');
    s.proc = spawn(A.binary, cmd, { stdio: ['ignore', 'pipe', log] });
    fs.closeSync(log);
    SERVERS.add(s);
    STARTED.push(s);
    s.exited = new Promise((resolve) => {
      s.proc.once('exit', resolve);
      s.proc.once('error', resolve); // never started (no such binary): no 'exit' comes
    });
    const ready = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no "switchyard: ready" within 120 s')), 120e3);
      s.proc.once('exit', (code, sig) => {
        clearTimeout(timer);
        reject(new Error(`the server exited (${code ?? sig}) before it was ready`));
      });
      s.proc.once('error', (e) => {
        clearTimeout(timer);
        reject(e);
      });
      // Keeps reading stdout for the child's whole life, so that its pipe never fills.
      readline.createInterface({ input: s.proc.stdout }).on('line', (line) => {
        let m = /http on http:\/\/127\.0\.0\.1:(\d+)/.exec(line);
        if (m) s.port = Number(m[1]);
        m = /metrics on http:\/\/127\.0\.0\.1:(\d+)/.exec(line);
        if (m) s.metricsPort = Number(m[1]);
        if (line.includes('switchyard: ready')) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
    try {
      await ready;
      if (!s.port) throw new Error('no "switchyard: http on" line');
    } catch (e) {
      await s.kill();
      throw new Error(`the server did not start: ${s.cmd}: ${e.message}\n${s.tail()}`);
    }
    return s;
  }

  get baseURL() {
    return `http://127.0.0.1:${this.port}/v1`;
  }

  // An SDK client for this server; no retries unless asked, so that errors surface as they come.
  client(opts = {}) {
    return new OpenAI({ baseURL: this.baseURL, apiKey: 'sk-local', maxRetries: 0,
      timeout: 120e3, ...opts });
  }

  tail(n = 3000) {
    try {
      return fs.readFileSync(this.logPath, 'utf8').slice(-n);
    } catch {
      return '';
    }
  }

  // Every series of /metrics as {'name{labels}': value}.
  async metrics() {
    const r = await fetch(`http://127.0.0.1:${this.metricsPort}/metrics`,
      { signal: AbortSignal.timeout(30e3) });
    assert.equal(r.status, 200, '/metrics');
    const out = {};
    for (const line of (await r.text()).split('\n')) {
      if (!line || line.startsWith('#')) continue;
      const i = line.lastIndexOf(' ');
      out[line.slice(0, i)] = Number(line.slice(i + 1));
    }
    return out;
  }

  async kill() {
    SERVERS.delete(this);
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
    await this.exited;
  }

  cleanup() {
    this.cleaned = true;
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

// The sum of a family's series whose labels include every pair given.
function sumSeries(m, name, labels = {}) {
  let total = 0;
  for (const [k, v] of Object.entries(m)) {
    if (k !== name && !k.startsWith(name + '{')) continue;
    if (Object.entries(labels).every(([n, x]) => k.includes(`${n}="${x}"`))) total += v;
  }
  return total;
}

function killAllSync() {
  for (const s of SERVERS) {
    try {
      s.proc.kill('SIGKILL');
    } catch {}
  }
}
process.on('exit', killAllSync);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    killAllSync();
    process.exit(1);
  });
}

// Servers several cases share, started when a case first asks (SY_CASE may skip them).
const shared = {};
async function stories() {
  shared.a ??= Server.start(STORIES, { extra: ['--chat-template', 'chatml'] });
  return shared.a;
}
async function zoo() {
  shared.z ??= Server.start(ZOO, { extra: ['--chat-template', 'chatml'] });
  return shared.z;
}

// ---- the case runner ---------------------------------------------------------------------------

const CASES = [];
const test = (name, fn) => CASES.push({ name, fn });

async function expectThrow(promise, Klass, what) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof Klass, `${what}: ${Klass.name} wanted, got ${e?.constructor?.name}: ${e}`);
    return e;
  }
  assert.fail(`${what}: ${Klass.name} wanted, nothing was thrown`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- 1. models ---------------------------------------------------------------------------------

test('models_list_and_retrieve', async () => {
  const c = (await stories()).client();
  const list = await c.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepEqual(ids, ['stories260K']);
  assert.equal(list.data[0].object, 'model');
  assert.equal(list.data[0].owned_by, 'switchyard');
  assert.equal(typeof list.data[0].created, 'number');
  const m = await c.models.retrieve('stories260K');
  assert.equal(m.id, 'stories260K');
  assert.equal(m.object, 'model');
  const e = await expectThrow(c.models.retrieve('gpt-4'), NotFoundError, 'unknown model');
  assert.equal(e.status, 404);
  assert.equal(e.code, 'model_not_found');
});

// ---- 2, 3. completions -------------------------------------------------------------------------

const GREEDY16 = { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 16, temperature: 0 };

test('completion_greedy_matches_llamacpp', async () => {
  const c = (await stories()).client();
  const r = await c.completions.create(GREEDY16);
  assert.equal(r.object, 'text_completion');
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.model, 'stories260K');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, ONCE16);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.usage.prompt_tokens, ONCE.prompt_token_ids.length);
  assert.equal(r.usage.completion_tokens, 16);
  assert.equal(r.usage.total_tokens, ONCE.prompt_token_ids.length + 16);
});

test('completion_stream', async () => {
  const c = (await stories()).client();
  // Without include_usage: content chunks, the last one carries the finish_reason.
  const chunks = [];
  for await (const ch of await c.completions.create({ ...GREEDY16, stream: true })) chunks.push(ch);
  assert.ok(chunks.length >= 2, `chunks: ${chunks.length}`);
  for (const ch of chunks) {
    assert.equal(ch.object, 'text_completion');
    assert.equal(ch.id, chunks[0].id);
    assert.equal(ch.choices.length, 1);
    assert.equal(ch.usage, undefined, 'no usage without include_usage');
  }
  assert.equal(chunks.map((ch) => ch.choices[0].text).join(''), ONCE16);
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  assert.ok(chunks.slice(0, -1).every((ch) => ch.choices[0].finish_reason === null), 'one finish');

  // With include_usage: usage null on content chunks, then one chunk of usage and no choices.
  const more = [];
  const s = await c.completions.create({ ...GREEDY16, stream: true,
    stream_options: { include_usage: true } });
  for await (const ch of s) more.push(ch);
  const usage = more.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.completion_tokens, 16);
  assert.equal(usage.usage.prompt_tokens, ONCE.prompt_token_ids.length);
  const body = more.slice(0, -1);
  for (const ch of body) assert.equal(ch.usage, null, 'usage null on content chunks');
  assert.equal(body.map((ch) => ch.choices[0].text).join(''), ONCE16);
  assert.equal(body.at(-1).choices[0].finish_reason, 'length');
});

// ---- 4. chat on the zoo model ------------------------------------------------------------------

test('chat_plain_streamed_json_schema', async () => {
  const c = (await zoo()).client();
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hi' }];
  const r = await c.chat.completions.create({ model: 'zoo-qwen2-f32', messages, max_tokens: 8,
    temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  assert.ok(r.usage.prompt_tokens > 5, 'the template is counted');

  // Streamed, greedy: the same text; the role in the first chunk, the finish in the last.
  const chunks = [];
  const s = await c.chat.completions.create({ messages, max_tokens: 8, temperature: 0,
    stream: true });
  for await (const ch of s) chunks.push(ch);
  assert.ok(chunks.length >= 2, `chunks: ${chunks.length}`);
  for (const ch of chunks) assert.equal(ch.object, 'chat.completion.chunk');
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.ok(chunks.slice(1).every((ch) => ch.choices[0].delta.role === undefined), 'role once');
  assert.equal(chunks.map((ch) => ch.choices[0].delta.content ?? '').join(''),
    r.choices[0].message.content);
  assert.equal(chunks.at(-1).choices[0].finish_reason, r.choices[0].finish_reason);

  // The SDK's json_schema response_format: constrained output JSON.parse takes. The zoo model's
  // weights are random: unbounded, its greedy integer is digits up to max_tokens, and with extra
  // keys allowed it goes on writing keys; bounds and additionalProperties: false let it end.
  const j = await c.chat.completions.create({ messages, max_tokens: 64, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', schema: {
      type: 'object', properties: { a: { type: 'integer', minimum: -1000, maximum: 1000 } },
      required: ['a'], additionalProperties: false } } } });
  const content = j.choices[0].message.content;
  assert.equal(j.choices[0].finish_reason, 'stop', `json_schema output ended: ${content}`);
  const obj = JSON.parse(content);
  assert.deepEqual(Object.keys(obj), ['a'], content);
  assert.ok(Number.isInteger(obj.a) && obj.a >= -1000 && obj.a <= 1000, `an integer a: ${content}`);
});

// ---- 5. errors ---------------------------------------------------------------------------------

test('errors_bad_request_and_auth', async () => {
  const c = (await stories()).client();
  for (const [body, param] of [[{ temperature: -1 }, 'temperature'], [{ n: 0 }, 'n']]) {
    const e = await expectThrow(c.completions.create({ prompt: 'x', max_tokens: 1, ...body }),
      BadRequestError, JSON.stringify(body));
    assert.equal(e.status, 400);
    assert.equal(e.param, param, `${JSON.stringify(body)}: ${e.message}`);
    assert.equal(e.type, 'invalid_request_error');
  }
  const t = await Server.start(STORIES, { config: 'admission:\n  tenants:\n' +
    '    - {name: alice, token: ta}\n    - {name: guest}\n' });
  try {
    const e = await expectThrow(t.client({ apiKey: 'wrong' }).completions.create(
      { prompt: 'x', max_tokens: 1 }), AuthenticationError, 'a wrong key');
    assert.equal(e.status, 401);
    assert.equal(e.code, 'invalid_api_key');
    const ok = await t.client({ apiKey: 'ta' }).completions.create({ prompt: 'x', max_tokens: 1 });
    assert.equal(ok.usage.completion_tokens, 1, 'the right key');
  } finally {
    await t.kill();
  }
  t.cleanup();
});

// ---- 6. overload: 429 and the SDK's retry ------------------------------------------------------

test('overload_429_and_sdk_retry', async () => {
  const o = await Server.start(STORIES,
    { extra: ['--max-waiting-requests', '1', '--test-admission-stall-ms', '100'] });
  try {
    const body = { prompt: 'Once upon a time', max_tokens: 4, temperature: 0, ignore_eos: true };
    const checkDone = (r, what) => {
      assert.equal(r.choices[0].finish_reason, 'length', what);
      assert.equal(r.usage.completion_tokens, 4, what);
    };

    // (a) No retries: some are refused with 429 naming its delay; the others ran fully.
    const noRetry = o.client({ maxRetries: 0 });
    const a = await Promise.allSettled(Array.from({ length: 8 },
      () => noRetry.completions.create(body)));
    const refused = a.filter((x) => x.status === 'rejected').map((x) => x.reason);
    assert.ok(refused.length >= 1, 'at least one request refused');
    for (const e of refused) {
      assert.ok(e instanceof RateLimitError, `a RateLimitError, got ${e?.constructor?.name}: ${e}`);
      assert.equal(e.status, 429);
      assert.equal(e.code, 'overloaded');
      const ms = e.headers.get('retry-after-ms');
      const s = e.headers.get('retry-after');
      assert.ok(ms !== null && s !== null, 'retry-after and retry-after-ms');
      assert.ok(Number(ms) > 0, `retry-after-ms ${ms}`);
      assert.equal(Number(s), Math.ceil(Number(ms) / 1000), 'Retry-After: whole seconds, up');
    }
    const okA = a.filter((x) => x.status === 'fulfilled').map((x) => x.value);
    okA.forEach((r) => checkDone(r, '(a) an accepted request ran fully'));

    // (b) The SDK retries on its own: every request gets through; each retry waited at least
    // the retry-after-ms its 429 named. A custom fetch sees every attempt.
    const attempts = new Map(); // request tag -> [{start, end, status, retryAfterMs}]
    const recordingFetch = async (url, init) => {
      const tag = new Headers(init?.headers).get('x-test-tag');
      const rec = { start: performance.now() };
      if (!attempts.has(tag)) attempts.set(tag, []);
      attempts.get(tag).push(rec);
      const res = await globalThis.fetch(url, init);
      rec.end = performance.now();
      rec.status = res.status;
      rec.retryAfterMs = res.headers.get('retry-after-ms');
      return res;
    };
    const retrying = o.client({ maxRetries: 8, fetch: recordingFetch });
    // Started 20 ms apart, all in flight together. Fired in one burst, their retries come back
    // in lockstep, each wave admits one, and the last request needs 7 of its 8 retries (a
    // margin of one); staggered, the most any needed here was 5. SY_VERBOSE=1 prints them.
    const b = await Promise.all(Array.from({ length: 8 }, async (_, i) => {
      await sleep(20 * i);
      return retrying.completions.create(body, { headers: { 'x-test-tag': `r${i}` } });
    }));
    b.forEach((r) => checkDone(r, '(b) every request ran fully'));
    assert.equal(attempts.size, 8);
    let seen429 = 0;
    for (const [tag, list] of attempts) {
      assert.equal(list.at(-1).status, 200, `${tag}: the last attempt succeeded`);
      for (let i = 0; i + 1 < list.length; i++) {
        assert.equal(list[i].status, 429, `${tag}: attempt ${i} retried after a 429`);
        seen429++;
        const wanted = Number(list[i].retryAfterMs);
        assert.ok(wanted > 0, `${tag}: retry-after-ms ${list[i].retryAfterMs}`);
        const gap = list[i + 1].start - list[i].end;
        assert.ok(gap >= wanted - 5,
          `${tag}: attempt ${i + 1} came ${gap.toFixed(1)} ms after a 429 that said ${wanted} ms`);
      }
    }
    assert.ok(seen429 >= 1, 'the SDK was told to retry at least once');
    if (process.env.SY_VERBOSE) {
      const tries = [...attempts.values()].map((l) => l.length);
      console.log(`  (a) ${refused.length} of 8 refused; (b) ${seen429} 429s, attempts ${tries}`);
    }

    // (c) Nothing accepted is lost: every accepted job ended done, none is still running, and
    // the 429s the server counted are the ones the clients saw.
    const accepted = okA.length + b.length;
    let m;
    const deadline = Date.now() + 30e3;
    for (;;) {
      m = await o.metrics();
      if (sumSeries(m, 'switchyard_jobs_total') >= accepted &&
          sumSeries(m, 'switchyard_jobs_active') === 0) break;
      if (Date.now() > deadline) break;
      await sleep(50);
    }
    assert.equal(sumSeries(m, 'switchyard_jobs_total'), accepted, 'jobs ended = accepted');
    assert.equal(sumSeries(m, 'switchyard_jobs_total', { outcome: 'done' }), accepted,
      'every accepted job done');
    assert.equal(sumSeries(m, 'switchyard_jobs_active'), 0, 'none still active');
    assert.equal(sumSeries(m, 'switchyard_http_overload_responses_total'),
      refused.length + seen429, '429s counted');
    assert.equal(sumSeries(m, 'switchyard_http_responses_total', { code: '2xx' }), accepted);
  } finally {
    await o.kill();
  }
  o.cleanup();
});

// ---- 7. the Batch API --------------------------------------------------------------------------

test('batch_api', async () => {
  const srv = await Server.start(STORIES, { journal: true });
  try {
    const c = srv.client();
    const jsonl = Array.from({ length: 20 }, (_, i) => JSON.stringify({
      custom_id: `c${i}`, method: 'POST', url: '/v1/completions',
      body: { model: 'stories260K', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 },
    }) + '\n').join('');
    const f = await c.files.create({ file: await toFile(Buffer.from(jsonl), 'b.jsonl'),
      purpose: 'batch' });
    assert.match(f.id, /^file-/);
    assert.equal(f.object, 'file');
    assert.equal(f.purpose, 'batch');
    assert.equal(f.bytes, Buffer.byteLength(jsonl));
    let batch = await c.batches.create({ input_file_id: f.id, endpoint: '/v1/completions',
      completion_window: '24h' });
    assert.match(batch.id, /^batch_/);
    assert.equal(batch.object, 'batch');
    const deadline = Date.now() + 120e3;
    while (batch.status !== 'completed') {
      assert.ok(!['failed', 'expired', 'cancelled'].includes(batch.status),
        `batch ended ${batch.status}: ${JSON.stringify(batch)}`);
      assert.ok(Date.now() < deadline, `batch not completed in 120 s: ${JSON.stringify(batch)}`);
      await sleep(100);
      batch = await c.batches.retrieve(batch.id);
    }
    assert.deepEqual(batch.request_counts, { total: 20, completed: 20, failed: 0 });
    const text = await (await c.files.content(batch.output_file_id)).text();
    const lines = text.split('\n').filter((x) => x).map((x) => JSON.parse(x));
    assert.equal(lines.length, 20);
    const ids = new Set(lines.map((x) => x.custom_id));
    assert.equal(ids.size, 20);
    for (let i = 0; i < 20; i++) assert.ok(ids.has(`c${i}`), `c${i} in the output`);
    for (const x of lines) {
      assert.equal(x.response.status_code, 200, JSON.stringify(x));
      assert.equal(x.error, null);
      assert.equal(x.response.body.choices[0].text, ONCE.generated_text.slice(0,
        x.response.body.choices[0].text.length), 'greedy text, a prefix of the reference');
      assert.equal(x.response.body.usage.completion_tokens, 8);
    }
  } finally {
    await srv.kill();
  }
  srv.cleanup();
});

// ---- main --------------------------------------------------------------------------------------

async function main() {
  const only = process.env.SY_CASE ?? '';
  let passed = 0;
  try {
    for (const { name, fn } of CASES) {
      if (only && !name.includes(only)) continue;
      const t0 = performance.now();
      try {
        await fn();
      } catch (e) {
        console.log(`FAIL ${name}`);
        console.log(e?.stack ?? String(e));
        for (const s of STARTED.filter((x) => !x.cleaned))
          console.log(`--- the end of ${s.logPath} (${s.cmd}):\n${s.tail()}`);
        process.exitCode = 1;
        return;
      }
      console.log(`ok   ${name} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
      passed++;
    }
    console.log(`${passed} passed`);
  } finally {
    for (const p of Object.values(shared)) {
      const s = await p.catch(() => null);
      if (s) {
        await s.kill();
        if (process.exitCode !== 1) s.cleanup();
      }
    }
    killAllSync();
  }
}

await main();
process.exit(process.exitCode ?? 0);
