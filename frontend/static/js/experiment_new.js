// New-experiment page: presets, the schema-driven form, a YAML view, and server errors placed by field path.
import { api, el, pageData } from "./api.js";
import { SchemaForm } from "./schema_form.js";

const data = pageData("page-data");
const form = new SchemaForm(document.getElementById("schema-form"), data.schema);
const yamlBox = document.getElementById("yaml-editor");
const yamlError = document.getElementById("yaml-error");
const metaErrors = document.getElementById("meta-errors");
const status = document.getElementById("submit-status");
const nameInput = document.getElementById("exp-name");
let mode = "form";
let nameTouched = false;

// --- start values ---------------------------------------------------------------------------------------

const presetList = document.getElementById("preset-list");
const presetButtons = {};
function choosePreset(name) {
  const config = name ? data.presets[name] : { model: { path: "" } };
  loadConfig(config);
  for (const [n, b] of Object.entries(presetButtons)) b.classList.toggle("active", n === name);
  if (!nameTouched) nameInput.value = config.name || "";
}
for (const name of Object.keys(data.presets)) {
  presetButtons[name] = el("button", { type: "button", class: "btn small", "data-preset": name,
    onclick: () => choosePreset(name) }, name);
  presetList.append(presetButtons[name]);
}
presetButtons[""] = el("button", { type: "button", class: "btn small", "data-preset": "",
  onclick: () => choosePreset("") }, "blank");
presetList.append(presetButtons[""]);

nameInput.addEventListener("input", () => { nameTouched = true; });
form.onChange = (path, value) => {
  if (path === "name" && !nameTouched) nameInput.value = value || "";
};

function loadConfig(config) {
  form.setValue(config);
  if (mode === "yaml") yamlBox.value = jsyaml.dump(form.getValue(), { sortKeys: false, lineWidth: 120 });
}

const start = data.start || {};
if (start.project) document.getElementById("exp-project").value = String(start.project);
if (start.config) {
  loadConfig(start.config);
  nameInput.value = start.name || "";
  nameTouched = true;
  document.getElementById("exp-description").value = start.description || "";
  document.getElementById("exp-tags").value = (start.tags || []).join(", ");
} else {
  choosePreset(start.preset || "");
}

// --- the project's form ---------------------------------------------------------------------------------
// The form is the project's (what its policy lets it run): another project's is fetched when picked.

const projectSelect = document.getElementById("exp-project");
let schemaProject = (data.schema["x-platform"] || {}).project;
projectSelect.addEventListener("change", async () => {
  const project = Number(projectSelect.value);
  if (project === schemaProject || (mode === "yaml" && !yamlToForm())) return;
  try {
    const schema = await api("/api/schema/experiment", { params: { project } });
    schemaProject = project;
    form.setSchema(schema);
    if (mode === "yaml") yamlBox.value = jsyaml.dump(form.getValue(), { sortKeys: false, lineWidth: 120 });
  } catch (err) {
    showErrors({ project: [err.message] }, err.message);
  }
});

// --- form / YAML toggle ---------------------------------------------------------------------------------

/** Parse the YAML box into the form; false (and a message) when it is not valid YAML. */
function yamlToForm() {
  try {
    const parsed = jsyaml.load(yamlBox.value);
    if (parsed !== null && (typeof parsed !== "object" || Array.isArray(parsed))) {
      throw new Error("the document must be a mapping of config sections");
    }
    form.setValue(parsed || {});
    yamlError.hidden = true;
    return true;
  } catch (err) {
    yamlError.textContent = `Not valid YAML: ${err.message.split("\n")[0]}`;
    yamlError.hidden = false;
    return false;
  }
}

function setMode(next) {
  if (next === mode) return;
  if (next === "yaml") {
    yamlBox.value = jsyaml.dump(form.getValue(), { sortKeys: false, lineWidth: 120 });
  } else if (!yamlToForm()) {
    return; // stay on the YAML view until it parses
  }
  mode = next;
  document.getElementById("form-view").hidden = mode !== "form";
  document.getElementById("yaml-view").hidden = mode !== "yaml";
  document.getElementById("view-form").classList.toggle("active", mode === "form");
  document.getElementById("view-yaml").classList.toggle("active", mode === "yaml");
}
document.getElementById("view-form").addEventListener("click", () => setMode("form"));
document.getElementById("view-yaml").addEventListener("click", () => setMode("yaml"));

// --- submit ---------------------------------------------------------------------------------------------

function clearMetaErrors() {
  metaErrors.hidden = true;
  metaErrors.replaceChildren();
  for (const f of document.querySelectorAll("[data-meta]")) {
    f.classList.remove("has-error");
    f.querySelector(".sf-error").textContent = "";
  }
}

/** A path of the API's answer relative to its body's `config` ("config.trainer.lr" -> "trainer.lr",
 * "config" -> ""), or null for another field: the one place the prefix is taken off. */
function inConfig(path) {
  if (path === "config") return "";
  return path.startsWith("config.") ? path.slice("config.".length) : null;
}

/** Split the API's field errors: config.* go to the schema form, the rest to the fields above it. */
function showErrors(fieldErrors, fallback) {
  const configErrors = {};
  let placed = 0;
  for (const [path, msgs] of Object.entries(fieldErrors)) {
    const inside = inConfig(path);
    if (inside !== null) { configErrors[inside] = msgs; continue; }
    const field = document.querySelector(`[data-meta="${CSS.escape(path.split(".")[0])}"]`);
    if (field) {
      field.classList.add("has-error");
      field.querySelector(".sf-error").textContent = msgs.join(" ");
    } else {
      metaErrors.append(el("div", {}, path ? `${path}: ${msgs.join(" ")}` : msgs.join(" ")));
      metaErrors.hidden = false;
    }
    placed += 1;
  }
  if (Object.keys(configErrors).length) {
    if (mode === "yaml") setMode("form"); // errors are shown next to the form's fields
    const first = form.showErrors(configErrors);
    if (first) first.scrollIntoView({ block: "center" });
    placed += 1;
  }
  if (!placed) {
    metaErrors.textContent = fallback;
    metaErrors.hidden = false;
  }
}

document.getElementById("experiment-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  if (mode === "yaml" && !yamlToForm()) return;
  clearMetaErrors();
  form.clearErrors();
  const btn = document.getElementById("create-btn");
  btn.disabled = true;
  status.textContent = "Validating…";
  const body = {
    project: Number(document.getElementById("exp-project").value),
    name: nameInput.value.trim(),
    description: document.getElementById("exp-description").value,
    tags: document.getElementById("exp-tags").value.split(",").map((t) => t.trim()).filter(Boolean),
    config: form.getValue(),
  };
  try {
    const exp = await api("/api/experiments", { method: "POST", body });
    if (document.getElementById("launch-after").checked) {
      status.textContent = "Created; launching…";
      const run = await api("/api/runs", { method: "POST", body: { experiment: exp.id } });
      window.location.href = `/runs/${run.id}/`;
    } else {
      window.location.href = `/experiments/${exp.id}/`;
    }
  } catch (err) {
    status.textContent = "";
    showErrors(err.fieldErrors || {}, err.message);
    btn.disabled = false;
  }
});
