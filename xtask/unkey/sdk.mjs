// unkey's published SDKs, unchanged, against limiterd: `node sdk.mjs <baseUrl> <rootKey>
// [<otherUrl>]`, the third a second limiterd on the same Redis (the fleet checks run then).
// Every check prints what it saw; the first that fails ends the run with exit code 1.
import { Unkey } from "@unkey/api";
import * as errors from "@unkey/api/models/errors";
import { Overrides, Ratelimit } from "@unkey/ratelimit";

const [baseUrl, rootKey, otherUrl] = process.argv.slice(2);
if (!baseUrl || !rootKey) {
  console.error("usage: node sdk.mjs <baseUrl> <rootKey>");
  process.exit(2);
}

let checks = 0;
function check(ok, what, seen) {
  checks += 1;
  if (!ok) {
    console.error(`FAIL ${what}: ${JSON.stringify(seen)}`);
    process.exit(1);
  }
  console.log(`ok   ${what}`);
}

// No retries: a 5xx would be a failure here, not something to wait out.
const client = (key) =>
  new Unkey({ serverURL: baseUrl, rootKey: key, retryConfig: { strategy: "none" } });
const unkey = client(rootKey);
const limit = (identifier, limit, extra = {}) =>
  unkey.ratelimit.limit({ namespace: "sdk", identifier, limit, duration: 60_000, ...extra });

// ratelimit.limit: a budget of 2, then a denial; cost and cost 0.
const first = await limit("ada", 2);
check(first.data.success && first.data.remaining === 1 && first.data.limit === 2, "limit admits", first);
check(typeof first.meta.requestId === "string" && first.meta.requestId.length > 0, "a request id", first.meta);
check(first.data.reset > Date.now() - 1000, "reset is Unix ms", first.data);
// As unkey answers: the end of the current window (of the duration, counted from the epoch).
check(first.data.reset % 60_000 === 0 && first.data.reset <= Date.now() + 60_000, "reset ends the current window", first.data);
check(!("overrideId" in first.data), "no overrideId without an override", first.data);
const second = await limit("ada", 2);
check(second.data.success && second.data.remaining === 0, "the last unit", second.data);
check(second.meta.requestId !== first.meta.requestId, "a fresh request id", [first.meta, second.meta]);
const third = await limit("ada", 2);
check(!third.data.success && third.data.remaining === 0, "over the limit", third.data);
check(third.data.reset % 60_000 === 0, "a denial's reset ends the current window too", third.data);
const costly = await limit("bob", 10, { cost: 7 });
check(costly.data.success && costly.data.remaining === 3, "a cost of 7", costly.data);
const peek = await limit("bob", 10, { cost: 0 });
check(peek.data.success && peek.data.remaining === 3, "cost 0 only reports", peek.data);

// ratelimit.multiLimit: all or nothing.
const multi = await unkey.ratelimit.multiLimit([
  { namespace: "sdk", identifier: "cy", limit: 5, duration: 60_000, cost: 2 },
  { namespace: "sdk", identifier: "ada", limit: 2, duration: 60_000 },
]);
check(!multi.data.passed && multi.data.limits.length === 2, "multiLimit refused as a whole", multi.data);
check(multi.data.limits[0].passed && !multi.data.limits[1].passed, "each check says why", multi.data.limits);
check(multi.data.limits[0].identifier === "cy" && multi.data.limits[0].namespace === "sdk", "in order", multi.data.limits);
const cy = await limit("cy", 5, { cost: 0 });
check(cy.data.remaining === 5, "a refused multiLimit took nothing", cy.data);
const passed = await unkey.ratelimit.multiLimit([
  { namespace: "sdk", identifier: "cy", limit: 5, duration: 60_000, cost: 2 },
  { namespace: "sdk", identifier: "dee", limit: 1, duration: 60_000 },
]);
check(passed.data.passed && passed.data.limits.every((l) => l.passed), "multiLimit admitted", passed.data);

// Keys: missing and wrong keys are refused in unkey's shape.
for (const [what, key] of [["a wrong key", "not-the-key"], ["a missing key", ""]]) {
  try {
    const r = await client(key).ratelimit.limit({ namespace: "sdk", identifier: "ada", limit: 2, duration: 60_000 });
    check(false, `${what} is refused`, r);
  } catch (e) {
    const refused = e instanceof errors.UnauthorizedErrorResponse || e instanceof errors.BadRequestErrorResponse;
    check(refused && [400, 401].includes(e.error?.status), `${what} is refused`, { name: e?.name, error: e?.error, message: e?.message });
  }
}

// Bad input: a 400 naming the field, never a 5xx.
try {
  const r = await unkey.ratelimit.limit({ namespace: "sdk", identifier: "ada", limit: 2, duration: 10 });
  check(false, "a 10 ms window is refused", r);
} catch (e) {
  check(e instanceof errors.BadRequestErrorResponse && e.error.errors[0].location === "body.duration",
    "a 10 ms window is refused, naming body.duration", { name: e?.name, error: e?.error, message: e?.message });
}

// @unkey/ratelimit, as an application uses it.
const limiter = new Ratelimit({ rootKey, baseUrl, namespace: "app", limit: 2, duration: "60s" });
const answers = [];
for (let i = 0; i < 3; i++) answers.push((await limiter.limit("eve")).success);
check(JSON.stringify(answers) === "[true,true,false]", "@unkey/ratelimit: 2 a minute", answers);
const other = await limiter.limit("fay", { cost: 2 });
check(other.success && other.remaining === 0, "@unkey/ratelimit: a cost", other);

// Overrides: every operation, a pattern, and the limit they put on calls.
const set = await unkey.ratelimit.setOverride({ namespace: "ovr", identifier: "team_*", limit: 3, duration: 60_000 });
check(set.data.overrideId.startsWith("ovr_"), "setOverride answers an id", set.data);
const exact = await unkey.ratelimit.setOverride({ namespace: "ovr", identifier: "team_red", limit: 1, duration: 60_000 });
const again = await unkey.ratelimit.setOverride({ namespace: "ovr", identifier: "team_*", limit: 2, duration: 60_000 });
check(again.data.overrideId === set.data.overrideId, "setting again keeps the id", [set.data, again.data]);
const got = await unkey.ratelimit.getOverride({ namespace: "ovr", identifier: "team_*" });
check(got.data.limit === 2 && got.data.duration === 60_000 && got.data.identifier === "team_*", "getOverride", got.data);
const viaPattern = await unkey.ratelimit.limit({ namespace: "ovr", identifier: "team_blue", limit: 100, duration: 60_000 });
check(viaPattern.data.limit === 2 && viaPattern.data.overrideId === set.data.overrideId, "a pattern's override applies", viaPattern.data);
const viaExact = await unkey.ratelimit.limit({ namespace: "ovr", identifier: "team_red", limit: 100, duration: 60_000 });
check(viaExact.data.limit === 1 && viaExact.data.overrideId === exact.data.overrideId, "an exact override beats a pattern", viaExact.data);
const overLimit = await unkey.ratelimit.limit({ namespace: "ovr", identifier: "team_red", limit: 100, duration: 60_000 });
check(!overLimit.data.success, "the override's limit holds", overLimit.data);
const listed = [];
const pages = await unkey.ratelimit.listOverrides({ namespace: "ovr", limit: 1 });
for await (const page of pages) listed.push(...page.result.data.map((o) => o.identifier));
check(JSON.stringify(listed) === JSON.stringify(["team_*", "team_red"]), "listOverrides follows its cursor to the end", listed);
const admin = new Overrides({ rootKey, baseUrl });
await admin.deleteOverride({ namespace: "ovr", identifier: "team_red" });
try {
  const r = await unkey.ratelimit.getOverride({ namespace: "ovr", identifier: "team_red" });
  check(false, "a deleted override is gone", r);
} catch (e) {
  check(e instanceof errors.NotFoundErrorResponse && e.error.status === 404, "a deleted override is a 404", { name: e?.name, error: e?.error });
}
const afterDelete = await unkey.ratelimit.limit({ namespace: "ovr", identifier: "team_red", limit: 100, duration: 60_000 });
check(afterDelete.data.limit === 2, "without its exact override, the pattern applies", afterDelete.data);

// A fleet: two instances on one Redis count one budget, and share overrides.
if (otherUrl) {
  const other = new Unkey({ serverURL: otherUrl, rootKey, retryConfig: { strategy: "none" } });
  const both = [unkey, other];
  let passedCalls = 0;
  for (let i = 0; i < 6; i++) {
    const r = await both[i % 2].ratelimit.limit({ namespace: "fleet", identifier: "ada", limit: 4, duration: 60_000 });
    if (r.data.success) passedCalls += 1;
  }
  check(passedCalls === 4, "two instances on one Redis admit exactly the budget", passedCalls);
  const vip = await unkey.ratelimit.setOverride({ namespace: "fleet", identifier: "vip_*", limit: 1, duration: 60_000 });
  let applied = null;
  for (const deadline = Date.now() + 5_000; Date.now() < deadline; ) {
    const r = await other.ratelimit.limit({ namespace: "fleet", identifier: "vip_7", limit: 100, duration: 60_000, cost: 0 });
    if (r.data.overrideId === vip.data.overrideId) {
      applied = r.data;
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  check(applied !== null && applied.limit === 1, "an override set on one instance applies on the other", applied);
}

console.log(`all ${checks} checks passed`);
