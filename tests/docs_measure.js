// What a reader of the docs site sees, measured in the page itself (tests/test_docs_site.py
// serves each page asked for with "?measure=..." with this script at its end). It waits
// for Material's own scripts (the copy buttons), then posts its findings as JSON to the
// test's server: code blocks and tables wider than the content column,
// identifiers in tables broken inside a word, what each copy button copies, the outputs
// shown, and where the landing page's install line and first code block are.
window.addEventListener("load", () => setTimeout(() => {
  const article = document.querySelector("article.md-content__inner");
  // the content column (Material lets tables reach into the article's padding)
  const column = document.querySelector(".md-content").getBoundingClientRect();
  const found = {width: window.innerWidth, wide: [], broken: [], copies: [], outputs: [],
                 install: null, code: null};
  const short = (el) => el.innerText.trim().slice(0, 100);
  for (const code of article.querySelectorAll("pre > code")) {
    if (code.scrollWidth > code.clientWidth + 1 || code.getBoundingClientRect().right > column.right + 1)
      found.wide.push(`code block ${code.scrollWidth} px in ${code.clientWidth} px: ${short(code)}`);
  }
  for (const table of article.querySelectorAll("table")) {
    const box = table.parentElement;  // Material's scrolling wrapper
    if (box.scrollWidth > box.clientWidth + 1 || table.getBoundingClientRect().right > column.right + 1)
      found.wide.push(`table ${box.scrollWidth} px in ${box.clientWidth} px: ${short(table)}`);
  }
  // Code in a table or a title may wrap between a name's parts (docs/_hooks/tables.py
  // inserts <wbr> after dots, commas, slashes, "::"), never inside a word
  // ("integrate.sol ve_ivp"); a sentence-long snake_case name (a test's) also after
  // its underscores
  for (const code of article.querySelectorAll("td code, th code, h1 code")) {
    if (code.getClientRects().length < 2) continue;
    const long = code.innerText.split(/\W/).some((w) => w.length > 30);
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    let previous = null, top = null;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i); range.setEnd(node, i + 1);
        const rect = range.getClientRects()[0];
        if (!rect) continue;
        const ch = node.data[i];
        const inWord = /\w/.test(previous) && /\w/.test(ch) && !(long && previous === "_");
        if (top !== null && rect.top > top + 2 && inWord)
          found.broken.push(`${code.innerText} (broken before ${JSON.stringify(ch)})`);
        if (top === null || rect.top > top + 2) top = rect.top;
        previous = ch;
      }
    }
  }
  // What each copy button copies, as Material decides it: the data-copy attribute of
  // the block's element where there is one, else the block's innerText while the block
  // carries [data-md-copying]
  for (const button of article.querySelectorAll("[data-clipboard-target]")) {
    const code = document.querySelector(button.getAttribute("data-clipboard-target"));
    code.setAttribute("data-md-copying", "");
    const holder = code.closest("[data-copy]");
    const text = (holder ? holder.getAttribute("data-copy") : code.innerText).trimEnd();
    code.removeAttribute("data-md-copying");
    found.copies.push({text: text, pycon: code.querySelector(".gp") !== null,
                       output: code.closest(".jb-output") !== null});
  }
  found.code_blocks = [...article.querySelectorAll("pre > code")]
    .filter((code) => !code.closest(".jb-output")).length;
  for (const block of article.querySelectorAll(".jb-output pre > code"))
    found.outputs.push(block.innerText);
  const install = article.querySelector(".jb-install");
  if (install) found.install = install.getBoundingClientRect().bottom;
  const first = [...article.querySelectorAll("pre")].find((pre) => !pre.closest(".jb-install"));
  if (first) found.code = first.getBoundingClientRect().top;
  // back to the test's server (a screenshot run lays the page out at the exact window
  // width; --dump-dom would not go below 500 px)
  fetch("/__measured" + location.search, {method: "POST", body: JSON.stringify(found)});
}, 500));
