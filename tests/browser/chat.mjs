// Opens the chat page at URL in Debian's chromium (headless, fresh profile), sends one
// message, waits for the answer to stop growing, saves a screenshot, and prints one JSON
// line with what it saw. tests/web_ui.rs starts the server and checks that line.
// usage: node chat.mjs URL SCREENSHOT.png MESSAGE
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [url, shot, message] = process.argv.slice(2);
if (!url || !shot || !message) {
	console.error('usage: node chat.mjs URL SCREENSHOT.png MESSAGE');
	process.exit(2);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const profile = mkdtempSync(join(tmpdir(), 'tq-chromium-'));
const ctx = await chromium.launchPersistentContext(profile, {
	executablePath: process.env.TQ_CHROMIUM ?? '/usr/bin/chromium',
	headless: true,
	timeout: 60_000,
	viewport: { width: 1280, height: 800 },
	args: [
		'--no-sandbox', // root in a container
		'--disable-gpu',
		'--disable-quic',
		'--no-first-run',
		'--disable-background-networking',
		'--disable-component-update',
		'--disable-sync'
	]
});
const seen = { page_status: 0, chat_status: 0, chat_request_has_message: false };
try {
	const page = ctx.pages()[0] ?? (await ctx.newPage());
	page.setDefaultTimeout(60_000);
	page.on('request', (r) => {
		if (r.url().includes('/chat/completions') && (r.postData() ?? '').includes(message)) {
			seen.chat_request_has_message = true;
		}
	});
	page.on('response', (r) => {
		if (r.url().includes('/chat/completions')) seen.chat_status = r.status();
	});
	const resp = await page.goto(url, { waitUntil: 'load', timeout: 60_000 });
	seen.page_status = resp?.status() ?? 0;

	const input = page.locator('textarea').first();
	await input.waitFor({ state: 'visible', timeout: 60_000 });
	await input.fill(message);
	await input.press('Enter');

	// The answer streams in ("Processing N%" while the prompt is read); it is done when
	// the footer shows the generation speed ("t/s") and the text has not changed for 2 s.
	const answer = page.locator('[aria-label="Assistant message with actions"]').last();
	await answer.waitFor({ state: 'visible', timeout: 120_000 });
	let text = '';
	let stable = 0;
	const deadline = Date.now() + 240_000;
	while (Date.now() < deadline && stable < 4) {
		await sleep(500);
		const now = (await answer.innerText({ timeout: 10_000 })).trim();
		stable = now === text && /\bt\/s\b/.test(now) ? stable + 1 : 0;
		text = now;
	}
	seen.answer = text;
	seen.answer_stable = stable >= 4;
	seen.user_message_shown = (await page.getByText(message, { exact: false }).count()) > 0;
	await page.screenshot({ path: shot, timeout: 30_000 });
} catch (e) {
	seen.error = String(e?.stack ?? e);
	try {
		await ctx.pages()[0]?.screenshot({ path: shot, timeout: 10_000 });
	} catch {}
} finally {
	await ctx.close().catch(() => {});
	rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(seen));
process.exit(seen.error ? 1 : 0);
