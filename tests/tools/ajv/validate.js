// Validates structured-output test results with ajv (JSON Schema 2020-12) + ajv-formats.
// Usage: node validate.js cases.json  where cases.json is [{"schema": {...}, "outputs": ["...", ...]}].
// Prints one line per failure; exit status 1 when any output fails to parse or validate.
const fs = require("fs");
const Ajv2020 = require("ajv/dist/2020");
const addFormats = require("ajv-formats");
const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
let bad = 0, checked = 0;
for (const [i, c] of cases.entries()) {
  const ajv = new Ajv2020({strict: false, allErrors: true});
  addFormats(ajv);
  const validate = ajv.compile(c.schema);
  for (const out of c.outputs) {
    checked++;
    let v;
    try { v = JSON.parse(out); } catch (e) { bad++; console.log(`case ${i}: not JSON: ${JSON.stringify(out)}`); continue; }
    if (!validate(v)) { bad++; console.log(`case ${i}: invalid ${JSON.stringify(out)}: ${ajv.errorsText(validate.errors)}`); }
  }
}
console.log(`ajv: ${checked} outputs checked, ${bad} failed`);
process.exit(bad ? 1 : 0);
