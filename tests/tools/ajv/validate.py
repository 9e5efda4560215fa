# Fallback validator (Debian python3-jsonschema) with the same input and output as validate.js,
# used only when node or the ajv install is missing.
import json, sys
import jsonschema
cases = json.load(open(sys.argv[1]))
bad = checked = 0
for i, c in enumerate(cases):
    cls = jsonschema.validators.validator_for(c["schema"], default=jsonschema.Draft202012Validator)
    v = cls(c["schema"], format_checker=cls.FORMAT_CHECKER)
    for out in c["outputs"]:
        checked += 1
        try:
            x = json.loads(out)
        except Exception:
            bad += 1; print(f"case {i}: not JSON: {out!r}"); continue
        errs = list(v.iter_errors(x))
        if errs:
            bad += 1; print(f"case {i}: invalid {out!r}: {errs[0].message}")
print(f"jsonschema: {checked} outputs checked, {bad} failed")
sys.exit(1 if bad else 0)
