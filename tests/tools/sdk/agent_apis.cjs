// End-to-end check of /v1/responses and /v1/messages with the official SDKs (openai, @anthropic-ai/sdk)
// against a running m3serve serving the demo model with the minimax_m3 parsers, greedy. Asserts the
// parsed objects: types, ids, content, stop reasons, usage, the streamed event order, and that a
// stream's final object equals the non-streamed answer (greedy: the same tokens).
// Usage: node agent_apis.cjs <base URL> <api key> <node_modules dir>
'use strict';
const assert = require('node:assert/strict');
const path = require('node:path');
const [BASE, KEY, MODULES] = process.argv.slice(2);
const OpenAI = require(path.join(MODULES, 'openai')).default;
const Anthropic = require(path.join(MODULES, '@anthropic-ai/sdk')).default;

const openai = new OpenAI({ baseURL: BASE + '/v1', apiKey: KEY, maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ baseURL: BASE, apiKey: KEY, maxRetries: 0, timeout: 120000 });

// A demo tool task the shipped model answers with a reasoning block and a calculator call
// (tests/data/demo/tool_tasks.jsonl, first line).
const SYSTEM = 'You are a helpful assistant.';
const QUESTION = 'What is 240 / 24?';
const PARAMS = {
  convert_units: { type: 'object', properties: { value: { type: 'number' }, from_unit: { type: 'string' }, to_unit: { type: 'string' } }, required: ['value', 'from_unit', 'to_unit'] },
  verse_lookup: { type: 'object', properties: { book: { type: 'string' }, chapter: { type: 'integer' }, verse: { type: 'integer' } }, required: ['book', 'chapter', 'verse'] },
  calculator: { type: 'object', properties: { expression: { type: 'string', description: 'for example 12 * 7' } }, required: ['expression'] },
};
const DESC = { convert_units: 'Convert a value from one unit to another.', verse_lookup: 'Look up a verse of the King James Bible.', calculator: 'Evaluate an arithmetic expression.' };
const NAMES = Object.keys(PARAMS);
const oaTools = NAMES.map((n) => ({ type: 'function', name: n, description: DESC[n], parameters: PARAMS[n], strict: false }));
const anTools = NAMES.map((n) => ({ name: n, description: DESC[n], input_schema: PARAMS[n] }));

function log(...a) { console.log(...a); }
function stripIds(x) { return JSON.parse(JSON.stringify(x, (k, v) => (k === 'id' || k === 'item_id' || k === 'call_id' ? undefined : v))); }
async function expectError(p, status, check) {
  try { await p; } catch (e) { assert.equal(e.status, status, `status ${e.status}: ${e.message}`); check(e); return; }
  assert.fail(`expected HTTP ${status}`);
}

async function responses() {
  const req = { model: 'demo', instructions: SYSTEM, input: QUESTION, tools: oaTools, reasoning: { effort: 'high' }, temperature: 0, max_output_tokens: 200 };
  const r = await openai.responses.create(req);
  log('responses: output types', r.output.map((o) => o.type).join(','), 'usage', JSON.stringify(r.usage));
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.equal(r.model, 'demo');
  assert.equal(r.instructions, SYSTEM);
  assert.equal(r.tools.length, 3);
  const rs = r.output.find((o) => o.type === 'reasoning');
  assert.ok(rs, 'a reasoning item');
  assert.match(rs.id, /^rs_/);
  assert.equal(rs.content[0].type, 'reasoning_text');
  assert.ok(rs.content[0].text.length > 0 && !rs.content[0].text.includes('think>'));
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.ok(calls.length >= 1, 'a function_call item');
  for (const c of calls) {
    assert.match(c.id, /^fc_/);
    assert.ok(c.call_id.length > 0);
    assert.ok(NAMES.includes(c.name), c.name);
    assert.equal(typeof JSON.parse(c.arguments), 'object');
    assert.equal(c.status, 'completed');
  }
  assert.equal(r.output_text, '');
  const u = r.usage;
  assert.ok(u.input_tokens > 0 && u.output_tokens > 0);
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.equal(typeof u.input_tokens_details.cached_tokens, 'number');
  assert.ok(u.output_tokens_details.reasoning_tokens > 0 && u.output_tokens_details.reasoning_tokens <= u.output_tokens);

  // The round trip: the output items sent back with each call's result; the model answers in text.
  const input2 = [{ role: 'user', content: [{ type: 'input_text', text: QUESTION }] }, ...r.output,
    ...calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: '10' }))];
  const r2 = await openai.responses.create({ ...req, input: input2 });
  log('responses round trip: output types', r2.output.map((o) => o.type).join(','), 'text', JSON.stringify(r2.output_text));
  assert.equal(r2.object, 'response');
  const msg = r2.output.find((o) => o.type === 'message');
  assert.ok(msg, 'a message item after the function_call_output');
  assert.match(msg.id, /^msg_/);
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'output_text');
  assert.ok(r2.output_text.length > 0);
  assert.ok(r2.usage.input_tokens > u.input_tokens, 'the second turn holds the first');

  // Streamed: events in order with consecutive sequence numbers; the final response equals the
  // non-streamed one (greedy), and the accumulated snapshot (the SDK's) equals response.completed's.
  const stream = openai.responses.stream(req);
  const events = [];
  for await (const ev of stream) events.push(ev);
  const final = await stream.finalResponse();
  const types = events.map((e) => e.type);
  log('responses stream:', types.join(' '));
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types.at(-1), 'response.completed');
  assert.equal(events[0].response.status, 'in_progress');
  const done = events.at(-1).response;
  assert.deepEqual(stripIds(done.output), stripIds(r.output));
  // (cached_tokens differs: the prefix cache holds the first request's prompt)
  for (const k of ['input_tokens', 'output_tokens', 'total_tokens']) assert.equal(done.usage[k], r.usage[k], k);
  assert.deepEqual(done.usage.output_tokens_details, r.usage.output_tokens_details);
  // (the SDK's snapshot adds parsed_arguments to function calls)
  assert.deepEqual(final.output.map(({ parsed_arguments, ...o }) => o), done.output);
  for (const [i, item] of done.output.entries()) {
    const mine = events.filter((e) => e.output_index === i).map((e) => e.type);
    assert.equal(mine[0], 'response.output_item.added');
    assert.equal(mine.at(-1), 'response.output_item.done');
    if (item.type === 'function_call') {
      assert.ok(mine.includes('response.function_call_arguments.delta'));
      const argsDone = events.find((e) => e.output_index === i && e.type === 'response.function_call_arguments.done');
      assert.equal(argsDone.arguments, item.arguments);
      const deltas = events.filter((e) => e.output_index === i && e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
      assert.equal(deltas, item.arguments);
    } else if (item.type === 'reasoning') {
      assert.deepEqual(mine.slice(1, 3), ['response.content_part.added', 'response.reasoning_text.delta']);
      const text = events.filter((e) => e.output_index === i && e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
      assert.equal(text, item.content[0].text);
    }
  }

  // Streamed text: message item events in the documented order.
  const ts = openai.responses.stream({ model: 'demo', input: 'Tell me about the garden.', temperature: 0, max_output_tokens: 12, reasoning: { effort: 'none' } });
  const tev = [];
  for await (const ev of ts) tev.push(ev);
  const tfinal = await ts.finalResponse();
  const tt = tev.map((e) => e.type);
  log('responses text stream:', tt.join(' '));
  assert.deepEqual(tt.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(tt.slice(-4), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.completed']);
  const deltas = tev.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.ok(deltas.length > 0);
  assert.equal(tev.find((e) => e.type === 'response.output_text.done').text, deltas);
  assert.equal(tfinal.output[0].content[0].text, deltas);
  assert.equal(tfinal.status, 'incomplete');
  assert.deepEqual(tfinal.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(tfinal.usage.output_tokens, 12);

  // Refused by name.
  await expectError(openai.responses.create({ model: 'demo', input: 'hi', store: true }), 400, (e) => assert.equal(e.param, 'store'));
  await expectError(openai.responses.create({ model: 'demo', input: 'hi', previous_response_id: r.id }), 400, (e) => assert.equal(e.param, 'previous_response_id'));
  await expectError(openai.responses.create({ model: 'demo', input: 'hi', tools: [{ type: 'web_search' }] }), 400, (e) => assert.equal(e.param, 'tools[0].type'));
  await expectError(openai.responses.create({ model: 'demo', input: 'hi', max_output_tokens: 0 }), 400, (e) => assert.equal(e.param, 'max_output_tokens'));
  await expectError(openai.responses.create({ model: 'nope', input: 'hi' }), 404, (e) => assert.equal(e.param, 'model'));
  // Images as the SDK sends them reach the image path (the demo model has no vision tower: refused by name,
  // naming the part); file_id is refused by name. (Images served end to end: tests/cli/server_vision_apis.sh.)
  const img = { type: 'input_image', image_url: 'data:image/png;base64,iVBORw0KGgo=', detail: 'auto' };
  await expectError(openai.responses.create({ model: 'demo', input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is it?' }, img] }] }), 400,
    (e) => assert.match(e.message, /input\[0\]\.content\[1\]: this model has no vision tower/));
  await expectError(openai.responses.create({ model: 'demo', input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'file-1', detail: 'auto' }] }] }), 400,
    (e) => assert.equal(e.param, 'input[0].content[0].file_id'));
}

async function messages() {
  const req = { model: 'demo', system: SYSTEM, max_tokens: 200, temperature: 0, tools: anTools, thinking: { type: 'enabled', budget_tokens: 100 }, messages: [{ role: 'user', content: QUESTION }] };
  const m = await anthropic.messages.create(req);
  log('messages: content types', m.content.map((b) => b.type).join(','), 'stop', m.stop_reason, 'usage', JSON.stringify(m.usage));
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, 'demo');
  const th = m.content.find((b) => b.type === 'thinking');
  assert.ok(th && th.thinking.length > 0 && !th.thinking.includes('think>'), 'a thinking block');
  const uses = m.content.filter((b) => b.type === 'tool_use');
  assert.ok(uses.length >= 1, 'a tool_use block');
  for (const b of uses) {
    assert.ok(b.id.length > 0);
    assert.ok(NAMES.includes(b.name));
    assert.equal(typeof b.input, 'object');
  }
  assert.equal(m.stop_reason, 'tool_use');
  assert.equal(m.stop_sequence, null);
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0);

  // count_tokens: the same prompt as served.
  const ct = await anthropic.messages.countTokens({ model: 'demo', system: SYSTEM, tools: anTools, thinking: req.thinking, messages: req.messages });
  assert.equal(ct.input_tokens, m.usage.input_tokens);
  // A named tool forces the call's opener into the prompt: counted as served.
  const named = { type: 'tool', name: 'calculator' };
  const ctn = await anthropic.messages.countTokens({ model: 'demo', system: SYSTEM, tools: anTools, tool_choice: named, messages: req.messages });
  const mn = await anthropic.messages.create({ ...req, thinking: undefined, tool_choice: named, max_tokens: 60 });
  assert.equal(ctn.input_tokens, mn.usage.input_tokens);
  assert.equal(mn.stop_reason, 'tool_use');
  assert.equal(mn.content[0].type, 'tool_use');
  assert.equal(mn.content[0].name, 'calculator');

  // The round trip: the assistant's blocks sent back, then a tool_result per call.
  const req2 = { ...req, messages: [...req.messages, { role: 'assistant', content: m.content },
    { role: 'user', content: uses.map((b) => ({ type: 'tool_result', tool_use_id: b.id, content: '10' })) }] };
  const m2 = await anthropic.messages.create(req2);
  log('messages round trip: content types', m2.content.map((b) => b.type).join(','), 'stop', m2.stop_reason);
  assert.ok(m2.usage.input_tokens > m.usage.input_tokens);
  const text = m2.content.find((b) => b.type === 'text');
  assert.ok(text && text.text.length > 0, 'a text block after the tool_result');
  assert.ok(['end_turn', 'max_tokens'].includes(m2.stop_reason), m2.stop_reason);

  // Streamed: the event sequence, and the SDK's final message equals the non-streamed one.
  const stream = anthropic.messages.stream(req);
  const events = [];
  for await (const ev of stream) events.push(ev);
  const final = await stream.finalMessage();
  const types = events.map((e) => e.type);
  log('messages stream:', [...new Set(types)].join(' '));
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  assert.equal(events[0].message.usage.input_tokens, m.usage.input_tokens);
  assert.deepEqual(stripIds(final.content), stripIds(m.content));
  assert.equal(final.stop_reason, 'tool_use');
  assert.deepEqual(final.usage.output_tokens, m.usage.output_tokens);
  const deltaKinds = new Set(events.filter((e) => e.type === 'content_block_delta').map((e) => e.delta.type));
  for (const k of ['thinking_delta', 'input_json_delta']) assert.ok(deltaKinds.has(k), k);
  // Each block: start, deltas, stop, in index order.
  let open = -1;
  for (const e of events) {
    if (e.type === 'content_block_start') { assert.equal(open, -1); open = e.index; }
    if (e.type === 'content_block_delta') assert.equal(e.index, open);
    if (e.type === 'content_block_stop') { assert.equal(e.index, open); open = -1; }
  }

  // Stop reasons: max_tokens, and a stop sequence taken from a greedy answer's own text.
  const plain = { model: 'demo', max_tokens: 24, temperature: 0, thinking: { type: 'disabled' }, messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me about the garden.' }] }] };
  const p = await anthropic.messages.create(plain);
  assert.equal(p.stop_reason, 'max_tokens');
  assert.equal(p.usage.output_tokens, 24);
  const ptext = p.content.find((b) => b.type === 'text').text;
  const word = ptext.trim().split(/\s+/)[2];
  assert.ok(word && word.length > 0, ptext);
  const ps = await anthropic.messages.create({ ...plain, stop_sequences: [word] });
  log('messages stop_sequence:', JSON.stringify(word), '->', ps.stop_reason, JSON.stringify(ps.content));
  assert.equal(ps.stop_reason, 'stop_sequence');
  assert.equal(ps.stop_sequence, word);
  assert.ok(ptext.startsWith(ps.content[0].text));
  const pss = anthropic.messages.stream({ ...plain, stop_sequences: [word] });
  const pfinal = await pss.finalMessage();
  assert.equal(pfinal.stop_reason, 'stop_sequence');
  assert.equal(pfinal.stop_sequence, word);
  assert.equal(pfinal.content[0].text, ps.content[0].text);

  // Errors in Anthropic's shape, naming the field.
  await expectError(anthropic.messages.create({ model: 'demo', messages: plain.messages }), 400, (e) => {
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'invalid_request_error');
    assert.match(e.error.error.message, /max_tokens/);
  });
  await expectError(anthropic.messages.create({ ...plain, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x/y.png' } }] }] }), 400,
    (e) => assert.match(e.error.error.message, /messages\[0\]\.content\[0\]: this model has no vision tower/));
  await expectError(anthropic.messages.create({ ...plain, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'file', file_id: 'file_1' } }] }] }), 400,
    (e) => assert.match(e.error.error.message, /source type 'file'/));
  const bad = new Anthropic({ baseURL: BASE, apiKey: 'wrong', maxRetries: 0 });
  await expectError(bad.messages.create(plain), 401, (e) => assert.equal(e.error.error.type, 'authentication_error'));
}

(async () => {
  await responses();
  log('responses: ok');
  await messages();
  log('messages: ok');
})().catch((e) => { console.error('FAIL:', e && e.stack ? e.stack : e); process.exit(1); });
