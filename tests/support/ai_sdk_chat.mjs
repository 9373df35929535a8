// The Vercel AI SDK against the Chat Completions face: `node ai_sdk_chat.mjs <base URL>
// <api key>` runs generateText over a multi-turn history, a client tool loop, and
// streamText on `openai.chat(...)`, and prints what each gave as one JSON object.
// Installed by the Makefile into .tools/ai-sdk, found through AI_SDK_MODULES
// (tests/http/test_http_chat_clients.py).
import { createRequire } from "node:module";

const require = createRequire(process.env.AI_SDK_MODULES + "/");
const { createOpenAI } = require("@ai-sdk/openai");
const { generateText, jsonSchema, stepCountIs, streamText, tool } = require("ai");

const [baseURL, apiKey] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey });
const model = openai.chat("demo-1");

const first = await generateText({
  model,
  messages: [{ role: "user", content: "My name is Ada." }],
});
const history = await generateText({
  model,
  messages: [
    { role: "user", content: "My name is Ada." },
    { role: "assistant", content: first.text },
    { role: "user", content: "What is my name?" },
  ],
});

const calls = [];
const looped = await generateText({
  model,
  prompt: '/tool lookup_order {"id": "A1"}',
  tools: {
    lookup_order: tool({
      description: "An order's status.",
      inputSchema: jsonSchema({ type: "object", properties: { id: { type: "string" } } }),
      execute: async (input) => {
        calls.push(input);
        return "shipped";
      },
    }),
  },
  stopWhen: stepCountIs(4),
});

const streamed = streamText({ model, prompt: "My name is Grace." });
const deltas = [];
for await (const delta of streamed.textStream) deltas.push(delta);
const usage = await streamed.usage;

console.log(
  JSON.stringify({
    first: first.text,
    history: history.text,
    loop: { text: looped.text, steps: looped.steps.length, calls },
    stream: { deltas, text: await streamed.text, usage, finish: await streamed.finishReason },
  }),
);
