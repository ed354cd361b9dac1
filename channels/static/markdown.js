// A small Markdown renderer for the webchat page: text in, DOM nodes out.
//
// Safe by construction: it never parses HTML. Every piece of the message becomes a text node
// (document.createTextNode / textContent) inside elements this file creates, so `<script>`,
// `<img onerror=…>` and the like in a message are shown as the characters they are. Links are
// made only for http:, https: and mailto: URLs, open in a new tab and carry
// rel="noopener noreferrer".
//
// What it knows (what models write): fenced code blocks (``` or ~~~, with a language),
// indented code is left as text; headings; bullet and numbered lists (nested by indentation);
// block quotes; tables (GitHub style); horizontal rules; paragraphs (a single line break is kept);
// inline code, **bold**, *italic*, ~~strikethrough~~, [links](https://…), <https://…> and bare
// https:// URLs, backslash escapes. Bounded: nesting stops at MAX_DEPTH, searches for a closing
// delimiter are cached so no input makes it quadratic.
(function () {
  "use strict";

  const MAX_DEPTH = 8;
  const LABEL_SEARCH = 500; // characters a link label may span
  const URL_SEARCH = 2000; // characters a link URL may span
  const PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

  function el(tag, cls) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    return node;
  }

  function safeUrl(raw) {
    const url = raw.trim();
    if (!url || /[\u0000-\u001f\u007f\s]/.test(url)) return null;
    let parsed;
    try {
      parsed = new URL(url);
    } catch (_err) {
      return null; // relative or malformed: shown as text
    }
    if (!["http:", "https:", "mailto:"].includes(parsed.protocol)) return null;
    return url;
  }

  function link(href, parent) {
    const a = el("a");
    a.setAttribute("href", href);
    a.setAttribute("rel", "noopener noreferrer");
    a.setAttribute("target", "_blank");
    parent.appendChild(a);
    return a;
  }

  // ---- inline ---------------------------------------------------------------------------------

  // Finds closing delimiters; remembers the last answer per delimiter so a text full of
  // unmatched openers is scanned once, not once per opener.
  class Closers {
    constructor(text) {
      this.text = text;
      this.found = new Map(); // delimiter -> [searched from, position or -1]
    }
    next(delim, from, valid) {
      const hit = this.found.get(delim);
      if (hit && hit[0] <= from && (hit[1] === -1 || hit[1] >= from)) return hit[1];
      let j = this.text.indexOf(delim, from);
      while (j !== -1 && !valid(j)) j = this.text.indexOf(delim, j + 1);
      this.found.set(delim, [from, j]);
      return j;
    }
  }

  const isSpace = (c) => c === undefined || /\s/.test(c);
  const isWord = (c) => c !== undefined && /[\p{L}\p{N}]/u.test(c);

  function backtickRun(text, i) {
    let n = 0;
    while (text[i + n] === "`") n += 1;
    return n;
  }

  function renderInline(text, parent, depth, inLink) {
    const closers = new Closers(text);
    let buf = "";
    const flush = () => {
      if (buf) parent.appendChild(document.createTextNode(buf));
      buf = "";
    };
    let i = 0;
    while (i < text.length) {
      const c = text[i];
      if (c === "\\" && i + 1 < text.length && PUNCT.includes(text[i + 1])) {
        buf += text[i + 1];
        i += 2;
        continue;
      }
      if (c === "\n") {
        flush();
        parent.appendChild(el("br"));
        i += 1;
        continue;
      }
      if (c === "`") {
        const n = backtickRun(text, i);
        const fence = "`".repeat(n);
        const close = closers.next(fence, i + n, (j) =>
          text[j - 1] !== "`" && text[j + n] !== "`");
        if (close === -1) {
          buf += fence;
          i += n;
          continue;
        }
        flush();
        let code = text.slice(i + n, close).replace(/\n/g, " ");
        if (code.length > 2 && code[0] === " " && code[code.length - 1] === " ") {
          code = code.slice(1, -1);
        }
        const node = el("code");
        node.textContent = code;
        parent.appendChild(node);
        i = close + n;
        continue;
      }
      if (!inLink && c === "[" && depth < MAX_DEPTH) {
        const parsed = parseLink(text, i);
        if (parsed) {
          flush();
          renderInline(parsed.label, link(parsed.href, parent), depth + 1, true);
          i = parsed.end;
          continue;
        }
      }
      if (!inLink && c === "<") {
        const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(text.slice(i, i + URL_SEARCH));
        const href = m && safeUrl(m[1]);
        if (href) {
          flush();
          link(href, parent).textContent = m[1];
          i += m[0].length;
          continue;
        }
      }
      if (!inLink && (c === "h" || c === "H") && !isWord(text[i - 1])) {
        const m = /^https?:\/\/[^\s<>"'`]+/i.exec(text.slice(i, i + URL_SEARCH));
        if (m) {
          const url = trimUrl(m[0]);
          const href = safeUrl(url);
          if (href && url.length > 8) {
            flush();
            link(href, parent).textContent = url;
            i += url.length;
            continue;
          }
        }
      }
      if ((c === "*" || c === "_" || c === "~") && depth < MAX_DEPTH) {
        const span = emphasis(text, i, closers);
        if (span) {
          flush();
          const node = el(span.tag);
          renderInline(span.inner, node, depth + 1, inLink);
          parent.appendChild(node);
          i = span.end;
          continue;
        }
      }
      buf += c;
      i += 1;
    }
    flush();
  }

  function trimUrl(url) {
    let out = url.replace(/[.,;:!?]+$/, "");
    // A closing parenthesis belongs to the URL only when it opens one too: (see https://x.y/a)
    while (out.endsWith(")") && (out.match(/\(/g) || []).length < (out.match(/\)/g) || []).length) {
      out = out.slice(0, -1).replace(/[.,;:!?]+$/, "");
    }
    return out;
  }

  function parseLink(text, start) {
    // [label](url "optional title")
    let depth = 0;
    let j = start;
    const labelLimit = Math.min(text.length, start + LABEL_SEARCH);
    for (; j < labelLimit; j += 1) {
      const ch = text[j];
      if (ch === "\\") { j += 1; continue; }
      if (ch === "[") depth += 1;
      else if (ch === "]") {
        depth -= 1;
        if (depth === 0) break;
      } else if (ch === "\n" && text[j + 1] === "\n") return null;
    }
    if (j >= labelLimit || text[j + 1] !== "(") return null;
    const label = text.slice(start + 1, j);
    let k = j + 2;
    let parens = 0;
    const urlLimit = Math.min(text.length, k + URL_SEARCH);
    const urlStart = k;
    for (; k < urlLimit; k += 1) {
      const ch = text[k];
      if (ch === "(") parens += 1;
      else if (ch === ")") {
        if (parens === 0) break;
        parens -= 1;
      } else if (ch === "\n") return null;
    }
    if (k >= urlLimit) return null;
    const inside = text.slice(urlStart, k).trim();
    const m = /^<?([^\s>]*)>?(?:\s+(?:"[^"]*"|'[^']*'))?$/.exec(inside);
    const href = m && safeUrl(m[1]);
    if (!href || !label.trim()) return null;
    return { label, href, end: k + 1 };
  }

  function emphasis(text, i, closers) {
    const c = text[i];
    const double = text[i + 1] === c;
    if (c === "~" && !double) return null;
    const delim = double ? c + c : c;
    const n = delim.length;
    const after = text[i + n];
    if (isSpace(after) || after === c) return null; // "* item", "***" are not emphasis here
    if (c === "_" && isWord(text[i - 1])) return null; // snake_case_name
    const valid = (j) => {
      if (j <= i + n) return false;
      if (isSpace(text[j - 1])) return false;
      if (text[j + n] === c || text[j - 1] === c) return false;
      if (c === "_" && isWord(text[j + n])) return false;
      return true;
    };
    const close = closers.next(delim, i + n, valid);
    if (close === -1) return null;
    const inner = text.slice(i + n, close);
    if (inner.includes("\n\n")) return null;
    const tag = c === "~" ? "del" : double ? "strong" : "em";
    return { tag, inner, end: close + n };
  }

  // ---- blocks ---------------------------------------------------------------------------------

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?(.*)$/;
  const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?: +(.*))?$/;
  const TABLE_RULE = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;
  const blank = (line) => line === undefined || !line.trim();

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)
      || ITEM.test(line);
  }

  function renderBlocks(lines, parent, depth) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (blank(line)) { i += 1; continue; }
      let m = FENCE.exec(line);
      if (m) { i = codeBlock(lines, i, m, parent); continue; }
      if (RULE.test(line)) { parent.appendChild(el("hr")); i += 1; continue; }
      m = HEADING.exec(line);
      if (m) {
        const h = el("h" + Math.min(m[1].length + 2, 6));
        renderInline(m[2], h, depth, false);
        parent.appendChild(h);
        i += 1;
        continue;
      }
      if (depth < MAX_DEPTH && QUOTE.test(line)) {
        const inner = [];
        while (i < lines.length && !blank(lines[i]) && (m = QUOTE.exec(lines[i]))) {
          inner.push(m[1]);
          i += 1;
        }
        const q = el("blockquote");
        renderBlocks(inner, q, depth + 1);
        parent.appendChild(q);
        continue;
      }
      if (depth < MAX_DEPTH && ITEM.test(line)) { i = list(lines, i, parent, depth); continue; }
      if (line.includes("|") && TABLE_RULE.test(lines[i + 1] || "") && lines[i + 1].includes("-")) {
        i = table(lines, i, parent, depth);
        continue;
      }
      const para = [line];
      i += 1;
      while (i < lines.length && !blank(lines[i]) && !startsBlock(lines[i])) {
        para.push(lines[i]);
        i += 1;
      }
      const p = el("p");
      renderInline(para.join("\n"), p, depth, false);
      parent.appendChild(p);
    }
  }

  function codeBlock(lines, i, m, parent) {
    const fence = m[1];
    const body = [];
    let j = i + 1;
    while (j < lines.length) {
      const t = lines[j].trim();
      if (t.startsWith(fence[0].repeat(fence.length)) && /^[`~]+$/.test(t)) break;
      body.push(lines[j]);
      j += 1;
    }
    const pre = el("pre");
    const code = el("code");
    if (m[2]) code.className = "language-" + m[2].replace(/[^\w+#.-]/g, "");
    code.textContent = body.join("\n");
    pre.appendChild(code);
    parent.appendChild(pre);
    return j + 1; // past the closing fence (or the end: an unclosed fence runs to the end)
  }

  function list(lines, i, parent, depth) {
    const first = ITEM.exec(lines[i]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const node = el(ordered ? "ol" : "ul");
    if (ordered) {
      const start = parseInt(first[2], 10);
      if (start !== 1) node.setAttribute("start", String(start));
    }
    const items = [];
    let current = null;
    let loose = false;
    while (i < lines.length) {
      const line = lines[i];
      const m = ITEM.exec(line);
      if (m && m[1].length === indent && /\d/.test(m[2]) === ordered) {
        current = [m[3] || ""];
        items.push(current);
        i += 1;
        continue;
      }
      if (blank(line)) {
        // A blank line ends the list unless more of it follows (indented, or another item).
        let k = i + 1;
        while (k < lines.length && blank(lines[k])) k += 1;
        const next = lines[k];
        const nm = next === undefined ? null : ITEM.exec(next);
        const sameList = nm && nm[1].length === indent && /\d/.test(nm[2]) === ordered;
        const continued = next !== undefined && /^ */.exec(next)[0].length > indent;
        if (!sameList && !continued) break;
        if (sameList) loose = true;
        current.push("");
        i = k;
        continue;
      }
      const lead = /^ */.exec(line)[0].length;
      if (lead > indent) {
        current.push(line.slice(Math.min(lead, indent + (ordered ? 3 : 2))));
        i += 1;
        continue;
      }
      if (!startsBlock(line) && current[current.length - 1] !== "") {
        current.push(line.trim()); // a lazy continuation of the item's paragraph
        i += 1;
        continue;
      }
      break;
    }
    for (const item of items) {
      const li = el("li");
      const holder = document.createDocumentFragment();
      renderBlocks(item, holder, depth + 1);
      if (!loose) {
        // A tight list: its items' paragraphs are plain lines, not spaced-out blocks.
        for (const p of Array.from(holder.childNodes)) {
          if (p.nodeName !== "P") continue;
          while (p.firstChild) holder.insertBefore(p.firstChild, p);
          p.remove();
        }
      }
      li.appendChild(holder);
      node.appendChild(li);
    }
    parent.appendChild(node);
    return i;
  }

  function cells(line) {
    let t = line.trim();
    if (t.startsWith("|")) t = t.slice(1);
    if (t.endsWith("|") && !t.endsWith("\\|")) t = t.slice(0, -1);
    const out = [];
    let cell = "";
    for (let k = 0; k < t.length; k += 1) {
      if (t[k] === "\\" && t[k + 1] === "|") { cell += "|"; k += 1; continue; }
      if (t[k] === "|") { out.push(cell.trim()); cell = ""; continue; }
      cell += t[k];
    }
    out.push(cell.trim());
    return out;
  }

  function table(lines, i, parent, depth) {
    const head = cells(lines[i]);
    const aligns = cells(lines[i + 1]).map((c) =>
      c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : c.startsWith(":") ? "left" : "");
    const wrap = el("div", "table-wrap");
    const tbl = el("table");
    const thead = el("thead");
    const tr = el("tr");
    head.forEach((c, k) => {
      const th = el("th");
      if (aligns[k]) th.className = "align-" + aligns[k];
      renderInline(c, th, depth + 1, false);
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    tbl.appendChild(thead);
    const tbody = el("tbody");
    let j = i + 2;
    while (j < lines.length && !blank(lines[j]) && lines[j].includes("|")) {
      const row = el("tr");
      cells(lines[j]).slice(0, Math.max(head.length, 1)).forEach((c, k) => {
        const td = el("td");
        if (aligns[k]) td.className = "align-" + aligns[k];
        renderInline(c, td, depth + 1, false);
        row.appendChild(td);
      });
      tbody.appendChild(row);
      j += 1;
    }
    tbl.appendChild(tbody);
    wrap.appendChild(tbl);
    parent.appendChild(wrap);
    return j;
  }

  function render(text) {
    const fragment = document.createDocumentFragment();
    renderBlocks(String(text).replace(/\r\n?/g, "\n").split("\n"), fragment, 0);
    return fragment;
  }

  window.GatehouseMarkdown = Object.freeze({ render });
})();
