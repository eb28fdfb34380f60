// A form rendered from a JSON Schema: the platform's form schema of a project (experiments.form_schema:
// pydantic's schema of rl_engine.config.ExperimentConfig, narrowed by the platform's policy).
//
// Handles: nested objects ($ref), enums, booleans, integers/numbers with bounds, strings, nullable values
// (anyOf [X, null]), optional sub-objects, free-form dicts (JSON text), tuples (prefixItems), arrays of
// enums (checkboxes), discriminated unions (oneOf + discriminator: a select that swaps the variant) and
// labelled choices ("x-choices": [{value, label}], a select; with "x-free-text" also an "other…" entry
// that opens a text box, the hint saying what may be typed there).
//
// The form keeps a plain JS value as its model; every input writes into it at its field path. The server
// is the judge of validity: numbers that do not parse are sent as typed so the API answers with a field
// error, which `showErrors` places next to the field whose data-path matches (or its nearest ancestor).
//
// Layout: the fields the schema marks "x-essential" (direct fields of a section, and the variant choice of
// a marked union) come first, unfolded, in one card; every section below holds the other fields and is
// folded until the user opens it (or an error in it opens it). What a run asks of the cluster ("x-group":
// "cluster": a whole section such as resources, or single fields such as trainer.device) is drawn in one
// folded "cluster" section of its own, last, labelled by its paths.

import { el } from "./api.js";

const clone = (v) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));
const CLUSTER = "cluster";
const OTHER = "\u0001other"; // the choice select's "other…" entry (no value a config holds)
const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/** "a.b" + "c" -> "a.b.c" */
const join = (base, key) => (base ? `${base}.${key}` : key);

export class SchemaForm {
  /**
   * @param {HTMLElement} root where the form is drawn
   * @param {object} schema the JSON Schema (with $defs)
   */
  constructor(root, schema) {
    this.root = root;
    this.schema = schema;
    this.defs = schema.$defs || {};
    this.value = {};
    this.opened = new Set(); // paths of the folded sections the user opened (kept across re-renders)
    this.onChange = null;
  }

  // --- public ------------------------------------------------------------------------------------------

  /** Draw another schema (another project's form) over the current value. */
  setSchema(schema) {
    this.schema = schema;
    this.defs = schema.$defs || {};
    this.value = this.fill(this.schema, this.value);
    this.render();
  }

  /** Replace the whole value (a preset, a parsed YAML document) and redraw. */
  setValue(value) {
    this.value = this.fill(this.schema, isObj(value) ? clone(value) : {});
    this.render();
  }

  /** The current config as a plain object (fields left empty are omitted: the server applies defaults). */
  getValue() {
    return clone(this.value);
  }

  clearErrors() {
    for (const n of this.root.querySelectorAll(".has-error")) n.classList.remove("has-error");
    for (const n of this.root.querySelectorAll(".sf-error")) n.textContent = "";
    const general = this.root.querySelector(".sf-general-errors");
    if (general) {
      general.replaceChildren();
      general.parentElement.hidden = true;
    }
  }

  /**
   * Show {"trainer.lr": ["msg"], "": ["cross-field msg"]} next to fields (paths relative to the config). A path with no field of its own
   * (e.g. "trainer.betas[0]", or "trainer" for a whole-section check) lands on its nearest ancestor;
   * errors with no field at all go to the box at the top of the form. Returns the first marked element.
   */
  showErrors(errors) {
    this.clearErrors();
    let first = null;
    const general = this.root.querySelector(".sf-general-errors");
    for (const [path, msgs] of Object.entries(errors || {})) {
      const target = this.findField(path);
      const text = (Array.isArray(msgs) ? msgs : [msgs]).join(" ");
      if (!target) {
        general.append(el("li", {}, path ? `${path}: ${text}` : text));
        first = first || general;
        // A cross-field check names the fields to change ("trainer.batch_size … rollout.n"): mark them too.
        for (const named of new Set(text.match(/\b[a-z_]+(?:\.[a-z_]+)+\b/g) || [])) {
          const field = this.root.querySelector(`[data-path="${CSS.escape(named)}"]`);
          if (field) this.mark(field, text);
        }
        continue;
      }
      this.mark(target, target.dataset.path === path ? text : `${path}: ${text}`);
      first = first || target;
    }
    if (general && general.children.length) general.parentElement.hidden = false;
    return first;
  }

  /** Flag a field (or section) as wrong, add the message to its error slot, and open its sections. */
  mark(target, message) {
    target.classList.add("has-error");
    const box = target.querySelector(":scope > .sf-error") || target.querySelector(".sf-error");
    if (!box.textContent.includes(message)) box.textContent = box.textContent ? `${box.textContent} ${message}` : message;
    for (let p = target.parentElement; p && p !== this.root; p = p.parentElement) {
      if (p.tagName === "DETAILS") p.open = true;
    }
  }

  /** The element for a field path, or for its nearest ancestor that has one. */
  findField(path) {
    let p = path;
    while (p) {
      const node = this.root.querySelector(`[data-path="${CSS.escape(p)}"]`);
      if (node) return node;
      p = p.replace(/(\[\d+\]|\.?[^.[\]]+)$/, "");
    }
    return null;
  }

  // --- schema helpers ----------------------------------------------------------------------------------

  /** Follow a $ref (keeping the referring node's own description/default/title). */
  deref(node) {
    if (node && node.$ref) {
      const name = node.$ref.split("/").pop();
      const { $ref, ...rest } = node;
      return { ...this.defs[name], ...rest };
    }
    return node || {};
  }

  /** Classify a property schema into what widget draws it. */
  kind(node) {
    const s = this.deref(node);
    if (s.oneOf && s.discriminator) return { kind: "union", s, nullable: false };
    if (s.anyOf) {
      const inner = s.anyOf.filter((t) => t.type !== "null");
      const nullable = inner.length !== s.anyOf.length;
      if (inner.length === 1) {
        const { anyOf, ...outer } = s;
        const merged = { ...this.deref(inner[0]), ...outer };
        const k = this.kind(merged);
        return { ...k, nullable: nullable || k.nullable };
      }
      return { kind: "json", s, nullable };
    }
    if (s["x-choices"]) return { kind: "choice", s, nullable: false };
    if (s.enum) return { kind: "enum", s, nullable: false };
    if (s.const !== undefined) return { kind: "const", s, nullable: false };
    if (s.type === "object" && s.properties) return { kind: "object", s, nullable: false };
    if (s.type === "object") return { kind: "json", s, nullable: false };
    if (s.type === "array" && s.prefixItems) return { kind: "tuple", s, nullable: false };
    if (s.type === "array" && s.items && this.deref(s.items).enum) return { kind: "multi", s, nullable: false };
    if (s.type === "array") return { kind: "json", s, nullable: false };
    if (s.type === "boolean") return { kind: "bool", s, nullable: false };
    if (s.type === "integer" || s.type === "number") return { kind: "number", s, nullable: false };
    return { kind: "string", s, nullable: false };
  }

  /** The variant schema of a discriminated union for a tag value (first variant when unknown). */
  variant(s, tag) {
    const prop = s.discriminator.propertyName;
    const ref = s.discriminator.mapping && s.discriminator.mapping[tag];
    if (ref) return this.deref({ $ref: ref });
    const match = s.oneOf.map((o) => this.deref(o)).find((o) => o.properties[prop] && o.properties[prop].const === tag);
    return match || this.deref(s.oneOf[0]);
  }

  unionTags(s) {
    if (s.discriminator.mapping) return Object.keys(s.discriminator.mapping);
    const prop = s.discriminator.propertyName;
    return s.oneOf.map((o) => this.deref(o).properties[prop].const);
  }

  /** Fill schema defaults into `value` (recursively for objects and unions); leaves required blanks empty. */
  fill(node, value) {
    const k = this.kind(node);
    if (k.kind === "union") {
      const prop = k.s.discriminator.propertyName;
      const v = isObj(value) ? value : {};
      const tag = v[prop] !== undefined ? v[prop] : this.unionTags(k.s)[0];
      const out = this.fill(this.variant(k.s, tag), v);
      out[prop] = tag;
      return out;
    }
    if (k.kind !== "object") return value;
    const out = isObj(value) ? value : {};
    for (const [key, prop] of Object.entries(k.s.properties)) {
      const pk = this.kind(prop);
      if (out[key] === undefined) {
        const d = this.deref(prop);
        if (d.default !== undefined) out[key] = clone(d.default);
        else if (pk.kind === "const") out[key] = pk.s.const;
        else if ((pk.kind === "object" || pk.kind === "union") && !pk.nullable) out[key] = {};
      }
      if ((pk.kind === "object" || pk.kind === "union") && isObj(out[key])) out[key] = this.fill(prop, out[key]);
    }
    return out;
  }

  // --- value access by dotted path ---------------------------------------------------------------------

  get(path) {
    let node = this.value;
    for (const part of path.split(".")) {
      if (!isObj(node)) return undefined;
      node = node[part];
    }
    return node;
  }

  set(path, v) {
    const parts = path.split(".");
    let node = this.value;
    for (const part of parts.slice(0, -1)) {
      if (!isObj(node[part])) node[part] = {};
      node = node[part];
    }
    const last = parts[parts.length - 1];
    if (v === undefined) delete node[last];
    else node[last] = v;
    if (this.onChange) this.onChange(path, v);
  }

  // --- drawing -----------------------------------------------------------------------------------------

  render() {
    const top = this.deref(this.schema);
    const general = el("div", { class: "alert error", hidden: true, "data-testid": "form-errors" },
      el("strong", {}, "The config has errors:"), el("ul", { class: "sf-general-errors" }));
    const essentials = [];
    const scalars = [];
    const sections = [];
    const cluster = [];
    for (const [key, prop] of Object.entries(top.properties)) {
      const k = this.kind(prop);
      const req = (top.required || []).includes(key);
      if ((k.kind === "object" || k.kind === "union") && inCluster(prop)) {
        cluster.push(this.subObject(key, key, prop, k));
      } else if (k.kind === "object" || k.kind === "union") {
        essentials.push(...this.essentialFields(key, prop, k));
        sections.push(this.section(key, prop, k));
        cluster.push(...this.clusterFields(key, prop, k));
      } else if (isEssential(prop)) {
        essentials.push(this.field(key, key, prop, k, req));
      } else {
        scalars.push(this.field(key, key, prop, k, req));
      }
    }
    const card = el("div", { class: "sf-essentials", "data-testid": "essentials" },
      el("div", { class: "sf-essentials-title" }, "Essentials"), el("div", { class: "sf-fields" }, essentials));
    const generalSection = this.folded("general", el("summary", {}, "general"),
      el("div", { class: "sf-body" }, el("div", { class: "sf-fields" }, scalars)));
    const advanced = el("div", { class: "sf-advanced-title muted small" }, "Advanced (folded: open a section to change it)");
    const clusterSection = this.folded(CLUSTER,
      el("summary", {}, CLUSTER, el("span", { class: "sf-union-tag" }, "what a run asks of the cluster: GPUs, CPUs, devices, threads")),
      el("div", { class: "sf-body", "data-testid": "cluster-section" }, ...cluster));
    this.root.replaceChildren(general, card, advanced, generalSection, ...sections, clusterSection);
  }

  /** The fields of a top-level section (its current variant's) that belong to the cluster section,
   * labelled by their path. */
  clusterFields(path, prop, k) {
    let s = k.s;
    if (k.kind === "union") s = this.variant(s, (this.get(path) || {})[s.discriminator.propertyName]);
    const grid = [];
    for (const [key, child] of Object.entries(s.properties)) {
      if (!inCluster(child)) continue;
      const cpath = join(path, key);
      grid.push(this.field(cpath, cpath, child, this.kind(child), (s.required || []).includes(key)));
    }
    return grid.length ? [el("div", { class: "sf-fields" }, grid)] : [];
  }

  /** A folded card: open only once the user opened it (or an error in it did: see `mark`). */
  folded(path, ...children) {
    const d = el("details", { class: "sf-section", "data-section": path, open: this.opened.has(path) }, ...children);
    d.addEventListener("toggle", () => (d.open ? this.opened.add(path) : this.opened.delete(path)));
    return d;
  }

  /** The essential fields of a top-level section, labelled by their path: its variant choice when the
   * union is marked, then its (current variant's) direct fields that are marked. */
  essentialFields(path, prop, k) {
    const out = [];
    let s = k.s;
    if (k.kind === "union") {
      const tag = (this.get(path) || {})[s.discriminator.propertyName];
      if (isEssential(prop)) out.push(this.unionSelect(join(path, s.discriminator.propertyName), path, s, tag, true));
      s = this.variant(s, tag);
    }
    for (const [key, child] of Object.entries(s.properties)) {
      const ck = this.kind(child);
      if (!isEssential(child) || ck.kind === "const" || ck.kind === "object" || ck.kind === "union") continue;
      const cpath = join(path, key);
      out.push(this.field(cpath, cpath, child, ck, (s.required || []).includes(key)));
    }
    return out;
  }

  /** A top-level section (a folded card) for an object or a union: the fields that are not essential. */
  section(path, prop, k) {
    const title = el("summary", {}, path);
    const desc = this.deref(prop).description;
    if (desc) title.append(el("span", { class: "sf-union-tag" }, desc));
    const body = el("div", { class: "sf-body" }, el("div", { class: "sf-error" }));
    body.append(...this.objectContent(path, prop, k, true));
    const d = this.folded(path, title, body);
    d.dataset.path = path;
    return d;
  }

  /** The fields of an object or the selected variant of a union: scalars in a grid, then sub-objects.
   * `topLevel`: a section's, whose essential fields (and marked variant choice) are drawn above instead. */
  objectContent(path, prop, k, topLevel = false) {
    let s = k.s;
    const grid = [];
    const nested = [];
    if (k.kind === "union") {
      const prop0 = s.discriminator.propertyName;
      const tag = (this.get(path) || {})[prop0];
      if (!(topLevel && isEssential(prop))) grid.push(this.unionSelect(join(path, prop0), path, s, tag));
      s = this.variant(s, tag);
    }
    for (const [key, child] of Object.entries(s.properties)) {
      const ck = this.kind(child);
      if (ck.kind === "const") continue; // the union's tag, drawn as the select above
      if (topLevel && isEssential(child) && ck.kind !== "object" && ck.kind !== "union") continue;
      if (topLevel && inCluster(child)) continue; // drawn in the cluster section
      const cpath = join(path, key);
      const req = (s.required || []).includes(key);
      if (ck.kind === "object" || ck.kind === "union") nested.push(this.subObject(key, cpath, child, ck));
      else grid.push(this.field(key, cpath, child, ck, req));
    }
    return [el("div", { class: "sf-fields" }, grid), ...nested];
  }

  unionSelect(tagPath, unionPath, s, tag, fullLabel = false) {
    const select = el("select", { id: `f-${tagPath}`, name: tagPath },
      this.unionTags(s).map((t) => el("option", { value: t, selected: t === tag }, t)));
    select.addEventListener("change", () => {
      // Keep the fields the two variants share (n, temperature…), take defaults for the rest.
      const old = this.get(unionPath) || {};
      const next = this.variant(s, select.value);
      const kept = {};
      for (const key of Object.keys(next.properties)) if (old[key] !== undefined) kept[key] = old[key];
      kept[s.discriminator.propertyName] = select.value;
      this.set(unionPath, this.fill({ ...s }, kept));
      this.render();
    });
    return el("div", { class: "sf-field", "data-path": tagPath },
      el("label", { for: `f-${tagPath}` }, fullLabel ? tagPath : s.discriminator.propertyName),
      select, el("span", { class: "sf-hint" }, "variant"), el("div", { class: "sf-error" }));
  }

  /** A nested object (model.tiny): optional ones get a checkbox that sets them to null. */
  subObject(key, path, prop, k) {
    const value = this.get(path);
    const box = el("div", { class: "sf-object", "data-path": path });
    const title = el("div", { class: "sf-object-title" });
    if (k.nullable) {
      const cb = el("input", { type: "checkbox", id: `f-${path}`, checked: isObj(value) });
      cb.addEventListener("change", () => {
        this.set(path, cb.checked ? this.fill(prop, {}) : null);
        this.render();
      });
      title.append(cb, el("label", { for: `f-${path}` }, key));
    } else {
      title.append(key);
    }
    const desc = this.deref(prop).description;
    if (desc) title.append(el("span", { class: "sf-union-tag" }, desc));
    box.append(title, el("div", { class: "sf-error" }));
    if (isObj(value)) box.append(...this.objectContent(path, prop, k));
    return box;
  }

  /** One scalar-ish field with its label, hint and error slot. */
  field(key, path, prop, k, required) {
    const s = k.s;
    const id = `f-${path}`;
    const wrap = el("div", { class: "sf-field", "data-path": path });
    const label = el("label", { for: id }, key, required ? el("span", { class: "sf-required" }, "*") : null);
    const hint = [];
    if (s.description) hint.push(s.description);
    const input = this.input(id, path, k, hint);
    if (k.kind === "json" || k.kind === "multi") wrap.classList.add("wide");
    if (k.kind === "bool") {
      wrap.append(el("label", { class: "sf-check", for: id }, input, key));
    } else {
      wrap.append(label, input);
    }
    if (hint.length) wrap.append(el("span", { class: "sf-hint" }, hint.join(" · ")));
    wrap.append(el("div", { class: "sf-error" }));
    return wrap;
  }

  /** A select of labelled choices ("x-choices"); with "x-free-text" an "other…" entry opens a text box
   * for a value of one's own. A value that is none of the choices is kept and shown as it is. */
  choiceInput(id, path, k, hint) {
    const s = k.s;
    const value = this.get(path);
    const empty = value === undefined || value === null || value === "";
    const known = s["x-choices"].some((c) => c.value === value);
    const free = s["x-free-text"];
    const own = !empty && !known;
    const opts = [];
    if (k.nullable) opts.push(el("option", { value: "", selected: empty }, "(none)"));
    else if (empty) opts.push(el("option", { value: "", selected: true, disabled: true }, "choose…"));
    for (const c of s["x-choices"]) opts.push(el("option", { value: c.value, selected: c.value === value }, c.label));
    if (free) opts.push(el("option", { value: OTHER, selected: own }, "other…"));
    else if (own) opts.push(el("option", { value, selected: true }, `${value} (not offered here)`));
    const sel = el("select", { id, name: path }, opts);
    const blank = () => (k.nullable ? null : undefined);
    const text = free ? el("input", { type: "text", id: `${id}-other`, name: `${path}-other`, hidden: !own,
      value: own ? String(value) : "", placeholder: free }) : null;
    sel.addEventListener("change", () => {
      if (text) text.hidden = sel.value !== OTHER;
      if (sel.value === OTHER) this.set(path, text.value === "" ? blank() : text.value);
      else this.set(path, sel.value === "" ? blank() : sel.value);
    });
    if (text) {
      text.addEventListener("input", () => this.set(path, text.value === "" ? blank() : text.value));
      hint.push(`other: ${free}`);
    }
    if (!s["x-choices"].length && !free) hint.push("nothing to choose from here: ask an operator");
    return el("div", { class: "sf-inline" }, text ? [sel, text] : [sel]);
  }

  input(id, path, k, hint) {
    const s = k.s;
    const value = this.get(path);
    switch (k.kind) {
      case "enum": {
        const opts = s.enum.map((o) => el("option", { value: o, selected: o === value }, o));
        if (k.nullable) opts.unshift(el("option", { value: "", selected: value === null }, "(none)"));
        const sel = el("select", { id, name: path }, opts);
        sel.addEventListener("change", () => this.set(path, sel.value === "" && k.nullable ? null : sel.value));
        return sel;
      }
      case "choice":
        return this.choiceInput(id, path, k, hint);
      case "bool": {
        const cb = el("input", { type: "checkbox", id, name: path, checked: value === true });
        cb.addEventListener("change", () => this.set(path, cb.checked));
        return cb;
      }
      case "number": {
        hint.push(boundsText(s, k.nullable));
        const inp = el("input", {
          type: "text", inputmode: s.type === "integer" ? "numeric" : "decimal", id, name: path,
          value: value === null || value === undefined ? "" : String(value),
          placeholder: k.nullable ? "none" : "",
        });
        inp.addEventListener("input", () => this.set(path, parseNumber(inp.value, s.type, k.nullable)));
        return inp;
      }
      case "tuple": {
        const items = s.prefixItems.map((item, i) => {
          const cur = Array.isArray(value) ? value[i] : undefined;
          const inp = el("input", { type: "text", inputmode: "decimal", id: i === 0 ? id : `${id}-${i}`,
            name: `${path}[${i}]`, value: cur === undefined ? "" : String(cur) });
          inp.addEventListener("input", () => {
            const arr = Array.isArray(this.get(path)) ? [...this.get(path)] : [];
            arr[i] = parseNumber(inp.value, this.deref(item).type || "number", false);
            this.set(path, arr);
          });
          return inp;
        });
        return el("div", { class: "sf-inline" }, items);
      }
      case "multi": {
        const options = this.deref(s.items).enum;
        const cur = Array.isArray(value) ? value : [];
        const boxes = options.map((o) => {
          const cb = el("input", { type: "checkbox", value: o, name: path, checked: cur.includes(o) });
          cb.addEventListener("change", () => {
            const now = new Set(Array.isArray(this.get(path)) ? this.get(path) : []);
            if (cb.checked) now.add(o); else now.delete(o);
            this.set(path, options.filter((x) => now.has(x)));
          });
          return el("label", { class: "sf-check" }, cb, o);
        });
        if (value === undefined) hint.push("none chosen: the server's default");
        return el("div", { class: "sf-inline", id }, boxes);
      }
      case "json": {
        hint.push(k.nullable ? "JSON; empty: none" : "JSON");
        const text = value === undefined || value === null ? "" : typeof value === "string" ? value : JSON.stringify(value);
        const ta = el("textarea", { id, name: path, rows: 2, spellcheck: "false" });
        ta.value = text;
        ta.addEventListener("input", () => {
          const raw = ta.value.trim();
          if (!raw) { this.set(path, k.nullable ? null : s.type === "array" ? [] : {}); return; }
          // Text that is not JSON is sent as a string: the server names the field in its error.
          try { this.set(path, JSON.parse(raw)); } catch { this.set(path, raw); }
        });
        return ta;
      }
      default: {
        if (k.nullable) hint.push("empty: none");
        const inp = el("input", { type: "text", id, name: path, value: value === null || value === undefined ? "" : String(value) });
        inp.addEventListener("input", () => {
          const v = inp.value;
          this.set(path, v === "" ? (k.nullable ? null : undefined) : v);
        });
        return inp;
      }
    }
  }
}

/** Whether the schema puts a property (a section or a field) in the cluster section. */
function inCluster(node) {
  return Boolean(node && node["x-group"] === CLUSTER);
}

/** Whether the schema marks a property as one of the essentials (drawn first, unfolded). */
function isEssential(node) {
  return Boolean(node && node["x-essential"]);
}

/** The bounds of a number schema in words: "≥ 1, ≤ 1024". */
function boundsText(s, nullable) {
  const parts = [s.type === "integer" ? "integer" : "number"];
  if (s.minimum !== undefined) parts.push(`≥ ${s.minimum}`);
  if (s.exclusiveMinimum !== undefined) parts.push(`> ${s.exclusiveMinimum}`);
  if (s.maximum !== undefined) parts.push(`≤ ${s.maximum}`);
  if (s.exclusiveMaximum !== undefined) parts.push(`< ${s.exclusiveMaximum}`);
  if (nullable) parts.push("empty: none");
  return parts.join(", ");
}

/** "3e-4" -> 0.0003; "" -> undefined/null; anything unparsable stays a string for the server to reject. */
function parseNumber(raw, type, nullable) {
  const t = raw.trim();
  if (t === "") return nullable ? null : undefined;
  const n = Number(t);
  if (Number.isNaN(n)) return t;
  return n;
}
