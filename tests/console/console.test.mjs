// End-to-end tests of the compliance console in a real browser against the
// real server. Run by `make test-console` (part of `make test`).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { startServer, launch, signIn, axe } from './harness.mjs';

const SHOTS = process.env.CONSOLE_SCREENSHOTS || '';
const XSS_LABEL = '<script>window.__xss=1</script>"><img src=x onerror="window.__xss=2">';
const XSS_NAME = '"><img src=x onerror=window.__xss=3>.txt';

let server, browser, seed;

before(async () => {
  server = await startServer();
  browser = await launch();
  const cli = (t, ...a) => server.cli(t, ...a);
  const report = cli('tok-alice', 'session', 'create', '--label', 'quarterly-report', '--labels', 'team=red');
  const xss = cli('tok-alice', 'session', 'create', '--label', XSS_LABEL, '--labels', 'team=blue');
  const other = cli('tok-mallory', 'session', 'create', '--label', 'other-tenant-secret');
  const p1 = cli('tok-alice', 'upload', '--session', report.id, server.file('q3.json', JSON.stringify({ revenue: 42, rows: [1, 2, 3] })));
  const p2 = cli('tok-alice', 'upload', '--session', xss.id, '--name', XSS_NAME, server.file('x.txt', '<b>bold?</b> plain text\n'));
  seed = { report: report.id, xss: xss.id, other: other.id, p1: p1.id, p2: p2.id };
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

async function shot(page, name) {
  if (!SHOTS) return;
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

async function newContext(opts = {}) {
  return browser.newContext({ viewport: { width: 1280, height: 900 }, ...opts });
}

/// The effective value of a policy field, as the policy page shows it.
async function effective(page, field) {
  await page.goto(`${server.base}/policy`);
  return (await page.locator(`td[data-field="${field}"]`).innerText()).trim();
}

async function auditRows(page, query) {
  await page.goto(`${server.base}/audit?${new URLSearchParams(query)}`);
  return page.locator('table.events tbody tr').allInnerTexts();
}

test('the compliance flow: policy, hold, refused and granted deletion, receipt, audit', async () => {
  const ctx = await newContext();
  const page = await signIn(ctx, server.base, 'tok-carol');

  // Tighten retention and lock the policy.
  await page.goto(`${server.base}/policy`);
  await page.getByLabel('Retention', { exact: true }).fill('3d');
  await page.getByLabel(/Lock the policy/).check();
  await page.getByRole('button', { name: 'Save policy' }).click();
  await page.waitForURL(/\/policy\?saved=1$/);
  await assert.doesNotReject(page.getByText('Saved.').waitFor());
  assert.equal(await effective(page, 'retention'), '3days');

  // A session's effective policy names the level of each value.
  await page.goto(`${server.base}/sessions/${seed.xss}`);
  await page.getByRole('link', { name: /where it comes from/ }).click();
  await page.waitForURL(/\/policy\?session=ses_/);
  const sourceOf = async (field) => (await page.locator(`td[data-source="${field}"]`).innerText()).trim();
  assert.equal(await sourceOf('retention'), 'tenant');
  assert.equal(await sourceOf('session_ttl'), 'server');

  // Back to the tenant's policy form.
  await page.goto(`${server.base}/policy`);

  // Loosening is refused, with the server's message next to the field.
  // Locked now: the label says so, and the field is still reachable by it.
  await page.getByLabel(/^Retention locked: tighten only$/).fill('10d');
  const [resp] = await Promise.all([
    page.waitForResponse((r) => r.url().endsWith('/policy') && r.request().method() === 'POST'),
    page.getByRole('button', { name: 'Save policy' }).click(),
  ]);
  assert.equal(resp.status(), 400);
  const refusal = page.locator('#retention-error');
  await refusal.waitFor();
  assert.match(await refusal.innerText(), /loosen the locked tenant policy/);
  assert.ok(await page.locator('.badge', { hasText: 'locked' }).count() > 0, 'locked fields are shown locked');
  await shot(page, 'policy');
  assert.equal(await effective(page, 'retention'), '3days', 'nothing changed');

  // Place a hold; a deletion is refused; release; delete.
  await page.goto(`${server.base}/sessions/${seed.report}`);
  await page.getByLabel('Reason for the hold').fill('litigation 2026-42');
  await page.getByRole('button', { name: 'Place a legal hold' }).click();
  await page.getByText('litigation 2026-42').waitFor();
  await shot(page, 'session');
  await page.goto(`${server.base}/overview`);
  await page.getByText('litigation 2026-42').waitFor(); // among the active holds
  await shot(page, 'overview');
  await page.goto(`${server.base}/sessions/${seed.report}`);

  await page.getByRole('link', { name: 'Delete this session…' }).click();
  await page.getByLabel(/Reason/).fill('end of matter');
  await page.getByRole('button', { name: 'Delete permanently' }).click();
  const alert = page.getByRole('alert');
  await alert.waitFor();
  assert.match(await alert.innerText(), /legal hold/i);
  await page.goto(`${server.base}/sessions/${seed.report}`);
  await page.getByText('litigation 2026-42').waitFor(); // still there, still held

  await page.getByRole('button', { name: 'Release the hold' }).click();
  await page.getByText('Not held.').waitFor();
  await page.getByRole('link', { name: 'Delete this session…' }).click();
  await shot(page, 'delete-confirm');
  await page.getByLabel(/Reason/).fill('end of matter');
  await page.getByRole('button', { name: 'Delete permanently' }).click();
  await page.waitForURL(/\/receipts\?id=rcpt_/);
  await page.getByText('Signature verified').first().waitFor();
  assert.match(await page.locator('main').innerText(), new RegExp(seed.report));
  await shot(page, 'receipt');

  // The receipt viewer verifies a pasted receipt, and catches a changed one.
  const json = await page.locator('details pre').first().textContent();
  await page.getByLabel(/Receipt JSON/).fill(json);
  await page.getByRole('button', { name: 'Verify signature' }).click();
  await page.getByText('Signature verified').first().waitFor();
  const forged = JSON.parse(json);
  forged.bytesDeleted = String(Number(forged.bytesDeleted || 0) + 1);
  await page.getByLabel(/Receipt JSON/).fill(JSON.stringify(forged));
  await page.getByRole('button', { name: 'Verify signature' }).click();
  await page.getByText('Signature does NOT verify').waitFor();

  // Verify the chain.
  await page.goto(`${server.base}/audit`);
  await page.getByRole('button', { name: 'Verify the chain' }).click();
  await page.waitForURL(/verified=1/);
  await page.getByText(/Verified: all \d+ events chain correctly/).waitFor();

  // Each action is in the audit log.
  const policy = await auditRows(page, { action: 'policy.set' });
  assert.ok(policy.some((r) => /\tok\t/.test(r)), `a policy.set ok: ${policy}`);
  const refusedPolicy = await auditRows(page, { action: 'policy.set', outcome: 'error' });
  assert.ok(refusedPolicy.some((r) => /loosen/.test(r)), `the refused loosening: ${refusedPolicy}`);
  const holds = await auditRows(page, { action: 'hold.set', session: seed.report });
  assert.ok(holds.some((r) => /hold placed/.test(r)) && holds.some((r) => /hold released/.test(r)), `${holds}`);
  const deletes = await auditRows(page, { action: 'session.delete', session: seed.report });
  assert.ok(deletes.some((r) => /\terror\t/.test(r) && /hold/i.test(r)), `the refused deletion: ${deletes}`);
  assert.ok(deletes.some((r) => /receipt=rcpt_/.test(r)), `the deletion: ${deletes}`);
  const verifies = await auditRows(page, { action: 'audit.verify', principal: 'carol' });
  assert.ok(verifies.some((r) => /\tok\t/.test(r)), `${verifies}`);
  await page.goto(`${server.base}/audit?session=${seed.report}`);
  await shot(page, 'audit');

  // The export streams the chain as NDJSON, ending with its own event.
  const exp = await page.request.get(`${server.base}/audit/export`);
  assert.equal(exp.headers()['content-type'], 'application/x-ndjson');
  const lines = (await exp.text()).trim().split('\n').map((l) => JSON.parse(l));
  assert.ok(lines.length > 5);
  assert.deepEqual(lines.map((e) => e.seq), lines.map((_, i) => i + 1));
  assert.equal(lines[0].prev_hash, '0'.repeat(64));
  await ctx.close();
});

test('an agent does not see the compliance actions', async () => {
  const ctx = await newContext();
  const page = await signIn(ctx, server.base, 'tok-alice');
  const nav = await page.getByRole('navigation', { name: 'Console sections' }).innerText();
  assert.match(nav, /Sessions/);
  assert.doesNotMatch(nav, /Policy|Audit/);
  await page.goto(`${server.base}/sessions/${seed.xss}`);
  assert.equal(await page.getByRole('button', { name: /legal hold/ }).count(), 0);
  for (const url of ['/policy', '/audit']) {
    const r = await page.goto(`${server.base}${url}`);
    assert.equal(r.status(), 403, url);
    assert.match(await page.getByRole('alert').innerText(), /may not call|needs one of/);
  }
  await ctx.close();
});

test('an auditor reads the audit log but cannot change the policy', async () => {
  const ctx = await newContext();
  const page = await signIn(ctx, server.base, 'tok-audrey');
  const r = await page.goto(`${server.base}/audit`);
  assert.equal(r.status(), 200);
  assert.ok(await page.locator('table.events tbody tr').count() > 0);
  await page.goto(`${server.base}/policy`);
  assert.equal(await page.getByRole('button', { name: 'Save policy' }).count(), 0);
  const before = await effective(page, 'retention');
  // Even a well-formed POST with her own CSRF token is refused by the server.
  const csrf = await page.locator('input[name=csrf]').first().getAttribute('value');
  const post = await page.request.post(`${server.base}/policy`, { form: { csrf, retention: '1h', locked: 'on' } });
  assert.equal(post.status(), 403);
  assert.match(await post.text(), /may not call/);
  assert.equal(await effective(page, 'retention'), before);
  await ctx.close();
});

test("another tenant's session is not found, exactly like one that does not exist", async () => {
  const ctx = await newContext();
  const page = await signIn(ctx, server.base, 'tok-carol');
  const foreign = await page.goto(`${server.base}/sessions/${seed.other}`);
  assert.equal(foreign.status(), 404);
  const foreignText = (await page.getByRole('alert').innerText()).replace(seed.other, 'ID');
  const made = `ses_${'0123456789abcdef'.repeat(2)}`;
  const unknown = await page.goto(`${server.base}/sessions/${made}`);
  assert.equal(unknown.status(), 404);
  const unknownText = (await page.getByRole('alert').innerText()).replace(made, 'ID');
  assert.equal(foreignText, unknownText);
  assert.equal((await page.goto(`${server.base}/sessions/${seed.other}/delete`)).status(), 404);
  assert.doesNotMatch(await page.content(), /other-tenant-secret/);
  await ctx.close();
});

test('a forged POST without the CSRF token is refused and changes nothing', async () => {
  const ctx = await newContext();
  const page = await signIn(ctx, server.base, 'tok-carol');
  const before = await effective(page, 'retention');
  const r = await page.request.post(`${server.base}/policy`, { form: { retention: '1h', locked: 'on' } });
  assert.equal(r.status(), 403);
  assert.match(await r.text(), /CSRF token is missing/);
  const hold = await page.request.post(`${server.base}/sessions/${seed.xss}/hold`, { form: { hold: 'true', reason: 'forged' } });
  assert.equal(hold.status(), 403);
  const cross = await page.request.post(`${server.base}/sessions/${seed.xss}/hold`, {
    form: { hold: 'true', reason: 'forged', csrf: 'x' }, headers: { origin: 'http://evil.example' },
  });
  assert.equal(cross.status(), 403);
  assert.equal(await effective(page, 'retention'), before);
  await page.goto(`${server.base}/sessions/${seed.xss}`);
  await page.getByText('Not held.').waitFor();
  await ctx.close();
});

test('markup in a session label and a payload name renders inert', async () => {
  for (const bypassCSP of [false, true]) {
    // With the CSP bypassed, escaping alone must keep it inert.
    const ctx = await newContext({ bypassCSP });
    const page = await signIn(ctx, server.base, 'tok-carol');
    for (const url of ['/sessions', `/sessions/${seed.xss}`, `/sessions/${seed.xss}/delete`, '/overview']) {
      const r = await page.goto(`${server.base}${url}`);
      assert.equal(r.headers()['content-security-policy']?.includes("default-src 'none'"), true);
      await page.waitForTimeout(100);
      assert.equal(await page.evaluate(() => globalThis.__xss), undefined, `${url} ran injected script`);
      assert.equal(await page.locator('img').count(), 0, `${url} grew an <img>`);
      assert.equal(await page.locator('main script').count(), 0);
    }
    await page.goto(`${server.base}/sessions/${seed.xss}`);
    assert.ok((await page.locator('main').innerText()).includes('<script>window.__xss=1</script>'), 'shown as text');
    await ctx.close();
  }
});

test('a cookie replayed after sign-out, or no cookie at all, gets nothing', async () => {
  const ctx = await newContext();
  const page = await signIn(ctx, server.base, 'tok-carol');
  const cookies = await ctx.cookies();
  const session = cookies.find((c) => c.name === 'spillway_console');
  assert.ok(session.httpOnly && session.sameSite === 'Strict' && session.expires > 0);
  const csrf = await page.locator('input[name=csrf]').first().getAttribute('value');
  const before = await effective(page, 'retention');
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.waitForURL(/signin\?why=signedout/);

  const replay = await newContext();
  await replay.addCookies([session]);
  const p2 = await replay.newPage();
  await p2.goto(`${server.base}/overview`);
  assert.match(p2.url(), /\/signin\?why=unknown/);
  const post = await p2.request.post(`${server.base}/policy`, { form: { csrf, retention: '1h', locked: 'on' }, maxRedirects: 0 });
  assert.equal(post.status(), 303);
  assert.match(post.headers().location, /\/signin/);

  const none = await newContext();
  const p3 = await none.newPage();
  await p3.goto(`${server.base}/sessions/${seed.xss}`);
  assert.match(p3.url(), /\/signin\?why=none/);
  const hold = await p3.request.post(`${server.base}/sessions/${seed.xss}/hold`, { form: { csrf, hold: 'true', reason: 'x' }, maxRedirects: 0 });
  assert.equal(hold.status(), 303);

  const check = await signIn(ctx, server.base, 'tok-carol');
  assert.equal(await effective(check, 'retention'), before);
  await check.goto(`${server.base}/sessions/${seed.xss}`);
  await check.getByText('Not held.').waitFor();
  for (const c of [ctx, replay, none]) await c.close();
});

test('an expired cookie gets nothing', async () => {
  const short = await startServer({ session_lifetime: '2s' });
  try {
    const ctx = await newContext();
    const page = await signIn(ctx, short.base, 'tok-carol');
    const csrf = await page.locator('input[name=csrf]').first().getAttribute('value');
    const cookie = (await ctx.cookies()).find((c) => c.name === 'spillway_console');
    assert.ok(cookie.expires > 0 && cookie.expires - Date.now() / 1000 <= 3, 'the cookie says its lifetime');
    await page.waitForTimeout(2500);
    // The browser drops it by itself; present it anyway, as a stolen or
    // replayed cookie would be: the server must refuse it too.
    await ctx.addCookies([{ ...cookie, expires: -1 }]);
    await page.goto(`${short.base}/policy`);
    assert.match(page.url(), /\/signin\?why=expired/);
    const post = await page.request.post(`${short.base}/policy`, { form: { csrf, retention: '1h', locked: 'on' }, maxRedirects: 0 });
    assert.equal(post.status(), 303);
    const again = await signIn(ctx, short.base, 'tok-carol');
    await again.goto(`${short.base}/policy`);
    assert.equal(await again.locator('td[data-field="retention"]').innerText(), '7days');
    await ctx.close();
  } finally {
    await short.stop();
  }
});

test('every page passes axe-core with no serious or critical violations', async () => {
  const ctx = await newContext();
  const signin = await ctx.newPage();
  await signin.goto(`${server.base}/signin`);
  const found = { '/signin': await axe(signin) };
  await shot(signin, 'signin');
  const page = await signIn(ctx, server.base, 'tok-carol');
  const pages = ['/overview', '/policy', '/sessions', '/sessions?hold=no&state=open', `/sessions/${seed.xss}`,
    `/sessions/${seed.xss}/delete`, `/payloads/${seed.p2}`, `/policy?session=${seed.xss}`, '/audit', '/receipts', `/sessions/${seed.other}`];
  for (const url of pages) {
    await page.goto(`${server.base}${url}`);
    found[url] = await axe(page);
    if (url === '/sessions') await shot(page, 'sessions');
  }
  const bad = Object.entries(found).filter(([, v]) => v.length);
  assert.deepEqual(bad, [], JSON.stringify(bad, null, 1));
  await ctx.close();
});

test('the pages work by keyboard alone, with a visible focus', async () => {
  const ctx = await newContext();
  const page = await signIn(ctx, server.base, 'tok-carol');
  await page.goto(`${server.base}/overview`);
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Skip to content');
  const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
  await page.keyboard.press('Tab');
  const focus = await page.evaluate(() => [document.activeElement.tagName, getComputedStyle(document.activeElement).outlineStyle]);
  assert.ok(outline !== 'none' || focus[1] !== 'none', 'focus is visible');
  // Reach the sessions link by Tab and follow it with Enter.
  for (let i = 0; i < 10; i++) {
    if ((await page.evaluate(() => document.activeElement.textContent)) === 'Sessions') break;
    await page.keyboard.press('Tab');
  }
  await page.keyboard.press('Enter');
  await page.waitForURL(/\/sessions$/);
  await ctx.close();
});

test('the storage history and the last verification survive a restart', async () => {
  // A server of its own: this one is restarted.
  const own = await startServer();
  try {
    const kept = own.cli('tok-alice', 'session', 'create', '--label', 'kept-history');
    own.cli('tok-alice', 'upload', '--session', kept.id, own.file('h.txt', 'x'.repeat(5000)));
    // The reaper samples every tenant at its first pass after a start.
    await own.restart();
    let ctx = await newContext();
    let page = await signIn(ctx, own.base, 'tok-carol');
    await page.goto(`${own.base}/audit`);
    await page.getByRole('button', { name: 'Verify the chain' }).click();
    await page.waitForURL(/verified=1/);
    const before = await page.getByText(/Verified: all \d+ events chain correctly/).innerText();
    await ctx.close();

    await own.restart();
    ctx = await newContext();
    page = await signIn(ctx, own.base, 'tok-carol');
    await page.goto(`${own.base}/audit`);
    const after = await page.getByText(/Verified: all \d+ events chain correctly/).innerText();
    assert.equal(after, before, 'the same verification, read back from the chain');
    assert.match(after, /by carol/);
    await page.goto(`${own.base}/overview`);
    await page.locator('summary', { hasText: 'The figures as a table' }).click();
    const rows = await page.locator('table', { hasText: 'Stored bytes and payloads' }).locator('tbody tr').allInnerTexts();
    assert.ok(rows.some((r) => /^0\s.*\s1$/.test(r.trim())), `today's sample holds the one payload: ${rows}`);
    await ctx.close();
  } finally {
    await own.stop();
  }
});
