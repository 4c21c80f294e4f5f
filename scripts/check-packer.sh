#!/usr/bin/env bash
# CI step (.ci/run): the Packer templates in examples/packer/, checked without
# packer and without the plugins (packer is not in Debian, PyPI or npm):
# - `packer fmt -check`'s formatter: packer fmt is hclwrite.Format; the npm
#   package @cdktf/hcl-tools is that Go function compiled to WebAssembly. A
#   template that Format would change fails.
# - parsed with python-hcl2 (PyPI): each template has its plugin's source type
#   (tart-cli, veertu-anka-vm-clone), uploads the pkg and the policy with file
#   provisioners, runs provision.sh, and sets every METALIFT_BAKE_* variable
#   provision.sh requires.
# NOT checked here: the plugins' own schemas (`packer validate` needs packer
# and the plugins), and a real build (a Mac with Tart or Anka).
set -euo pipefail
cd "$(dirname "$0")/.."

tools="${TMPDIR:-/tmp}/metalift-hcl-tools"
if [ ! -d "$tools/node_modules/@cdktf/hcl-tools" ]; then
  mkdir -p "$tools"
  npm install --silent --prefix "$tools" @cdktf/hcl-tools@0.21.0
fi
python3 -c 'import hcl2' 2>/dev/null ||
  python3 -m pip install -q python-hcl2==8.1.4 ||
  python3 -m pip install -q --user --break-system-packages python-hcl2==8.1.4

NODE_PATH="$tools/node_modules" node - examples/packer/*.pkr.hcl <<'JS'
const { format } = require("@cdktf/hcl-tools");
const fs = require("fs");
(async () => {
  let bad = 0;
  for (const f of process.argv.slice(2)) {
    const src = fs.readFileSync(f, "utf8");
    if ((await format(src)) !== src) {
      console.log(`${f}: hclwrite.Format (packer fmt) would change it`);
      bad++;
    } else {
      console.log(`${f}: formatted as packer fmt leaves it`);
    }
  }
  process.exit(bad ? 1 : 0);
})();
JS

python3 - <<'PY'
import re, sys, hcl2
script = open("examples/packer/provision.sh").read()
needed = set(re.search(r"for var in ([A-Z0-9_ ]+); do need", script).group(1).split())
problems = []
def unq(v):
    """python-hcl2 8 keeps a string literal's quotes."""
    return v[1:-1] if isinstance(v, str) and len(v) >= 2 and v[0] == v[-1] == '"' else v
for path, source_type in [("examples/packer/tart.pkr.hcl", "tart-cli"),
                          ("examples/packer/anka.pkr.hcl", "veertu-anka-vm-clone")]:
    doc = hcl2.load(open(path))
    types = [t.strip('"') for s in doc["source"] for t in s]
    if types != [source_type]:
        problems.append(f"{path}: sources {types}, want [{source_type}]")
    provisioners = doc["build"][0]["provisioner"]
    files = [p['"file"'] for p in provisioners if '"file"' in p]
    shells = [p['"shell"'] for p in provisioners if '"shell"' in p]
    destinations = sorted(unq(f["destination"]) for f in files)
    if destinations != ["/tmp/50-bake.toml", "/tmp/metalift.pkg"]:
        problems.append(f"{path}: file provisioners upload to {destinations}")
    if len(shells) != 1 or unq(shells[0].get("script")) != "provision.sh":
        problems.append(f"{path}: no shell provisioner running provision.sh")
        continue
    set_vars = {unq(v).split("=", 1)[0] for v in shells[0].get("environment_vars", [])}
    if not needed <= set_vars:
        problems.append(f"{path}: provision.sh needs {sorted(needed - set_vars)}")
    print(f"{path}: source {source_type}, uploads {destinations}, provision.sh with {sorted(set_vars)}")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
echo "check-packer: passed (formatting and structure; packer validate and a real bake need a Mac)"
