// The capsule explorer's page: drawing, capsule bars, sliders and routing maps.
// Everything the model computes comes from the JSON endpoints of app.py.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  info: null,       // GET /api/info
  result: null,     // last POST /api/classify reply
  shown: null,      // class whose capsule is reconstructed
  deltas: [],       // slider values, one per capsule dimension
  inflight: false,  // a decode request is on its way
  pending: false,   // the sliders moved meanwhile: decode again when it returns
  generation: 0,    // counts classifications: a decode of an older one is dropped
  busy: 0,
};
// Measured per slider update, read by the browser test and shown on the page.
window.explorerStats = { decodeRoundTripMs: [], decodeServerMs: [] };

function setBusy(delta) {
  state.busy += delta;
  document.body.dataset.busy = state.busy > 0 ? "1" : "0";
}

function status(text, isError) {
  const line = $("status");
  line.textContent = text;
  line.classList.toggle("error", Boolean(isError));
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const reply = await fetch(path, options);
  const data = await reply.json().catch(() => ({ error: `HTTP ${reply.status}` }));
  if (!reply.ok) throw new Error(data.error || `HTTP ${reply.status}`);
  return data;
}

// Gray pixels (rows of values in [0, 1]) into a canvas of the same size.
function paintGray(canvas, pixels) {
  const height = pixels.length, width = pixels[0].length;
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext("2d");
  const image = context.createImageData(width, height);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const value = Math.round(255 * Math.min(1, Math.max(0, pixels[y][x])));
      const at = 4 * (y * width + x);
      image.data[at] = image.data[at + 1] = image.data[at + 2] = value;
      image.data[at + 3] = 255;
    }
  }
  context.putImageData(image, 0, 0);
}

// ---- drawing -------------------------------------------------------------
const draw = $("draw");
const pen = draw.getContext("2d");
let stroke = null;

function clearDrawing() {
  pen.fillStyle = "#000";
  pen.fillRect(0, 0, draw.width, draw.height);
}

function pointAt(event) {
  const box = draw.getBoundingClientRect();
  return [(event.clientX - box.left) * draw.width / box.width,
          (event.clientY - box.top) * draw.height / box.height];
}

draw.addEventListener("pointerdown", (event) => {
  draw.setPointerCapture(event.pointerId);
  stroke = pointAt(event);
  pen.fillStyle = "#fff";
  pen.beginPath();
  pen.arc(stroke[0], stroke[1], 11, 0, 2 * Math.PI);
  pen.fill();
});
draw.addEventListener("pointermove", (event) => {
  if (!stroke) return;
  const next = pointAt(event);
  pen.strokeStyle = "#fff";
  pen.lineWidth = 22;
  pen.lineCap = "round";
  pen.lineJoin = "round";
  pen.beginPath();
  pen.moveTo(stroke[0], stroke[1]);
  pen.lineTo(next[0], next[1]);
  pen.stroke();
  stroke = next;
});
for (const name of ["pointerup", "pointercancel"]) {
  draw.addEventListener(name, () => {
    if (!stroke) return;
    stroke = null;
    classify({ drawing: draw.toDataURL("image/png") });
  });
}

// A test digit is shown on the drawing canvas, scaled up; drawing on it adds strokes.
function showOnCanvas(pixels) {
  const small = document.createElement("canvas");
  paintGray(small, pixels);
  clearDrawing();
  pen.imageSmoothingEnabled = true;
  pen.drawImage(small, 0, 0, draw.width, draw.height);
}

// ---- classification ----------------------------------------------------------
async function classify(request) {
  setBusy(1);
  try {
    const result = await api("/api/classify", request);
    paintGray($("model-input"), result.input);
    if (result.empty) {
      status("Nothing drawn yet: draw a digit.");
      return;
    }
    state.result = result;
    state.generation += 1;
    state.shown = result.class_id;
    $("prediction").textContent = result.class_name;
    $("probability").textContent = result.probability.toFixed(3);
    $("label-line").hidden = result.label === null;
    $("digit-label").textContent = result.label === null ? "-" : String(result.label);
    $("class-picker").value = String(result.class_id);
    resetSliders(false);
    paintGray($("reconstruction"), result.reconstruction);
    bumpReconstruction();
    drawBars();
    drawRouting();
    const what = result.test_index === null ? "Your drawing" : `Test digit #${result.test_index}`
      + ` (label ${result.label})`;
    status(`${what}: class ${result.class_name}, probability ${result.probability.toFixed(3)}`
      + ` (${result.server_ms.classify.toFixed(0)} ms).`);
  } catch (error) {
    status(error.message, true);
  } finally {
    setBusy(-1);
  }
}

async function loadTestDigit(index) {
  const query = index === null || index === "" ? "" : `?index=${encodeURIComponent(index)}`;
  setBusy(1);
  try {
    status("Loading a test digit...");
    const digit = await api(`/api/test_digit${query}`);
    showOnCanvas(digit.pixels);
    await classify({ test_index: digit.index });
  } catch (error) {
    status(error.message, true);
  } finally {
    setBusy(-1);
  }
}

// ---- capsule lengths ---------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";

// An element with attributes and text; text goes in as text, never as markup
// (class names come from the export's files).
function element(tag, attributes, text, namespace) {
  const node = namespace ? document.createElementNS(namespace, tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawBars() {
  const svg = $("bars");
  const lengths = state.result.lengths;
  const names = state.info.class_names;
  const width = 320, top = 18, bottom = 170, step = width / lengths.length;
  const parts = [];
  lengths.forEach((length, k) => {
    const height = (bottom - top) * length;
    const classes = ["bar"];
    if (k === state.result.class_id) classes.push("winner");
    if (k === state.shown) classes.push("shown");
    const x = k * step + 5;
    const bar = element("rect", {
      id: `bar-${k}`, class: classes.join(" "), x, width: step - 10, y: bottom - height,
      height: Math.max(height, 0.5), "data-length": length,
    }, undefined, SVG);
    bar.appendChild(element("title", {}, `class ${names[k]}: length ${length.toFixed(4)}`, SVG));
    parts.push(bar);
    const middle = x + (step - 10) / 2;
    parts.push(element("text", { x: middle, y: bottom - height - 4 }, length.toFixed(2), SVG));
    parts.push(element("text", { x: middle, y: bottom + 14 }, names[k], SVG));
  });
  svg.replaceChildren(...parts);
}

// ---- reconstruction and sliders ----------------------------------------------
function bumpReconstruction() {
  const canvas = $("reconstruction");
  canvas.dataset.version = String(Number(canvas.dataset.version) + 1);
}

function buildSliders() {
  const box = $("sliders");
  const range = state.info.slider_range;
  state.deltas = new Array(state.info.capsule_dim).fill(0);
  for (let d = 0; d < state.info.capsule_dim; d++) {
    const slider = element("input", {
      type: "range", id: `dim-${d}`, min: -range, max: range, step: 0.01, value: 0,
    });
    slider.disabled = true;
    const row = element("label", { class: "slider" });
    row.append(element("span", { class: "name" }, `d${d + 1}`), slider,
      element("span", { class: "value", id: `dim-${d}-value` }, "+0.00"));
    box.appendChild(row);
    slider.addEventListener("input", () => {
      state.deltas[d] = Number(slider.value);
      $(`dim-${d}-value`).textContent = (state.deltas[d] >= 0 ? "+" : "")
        + state.deltas[d].toFixed(2);
      decode();
    });
  }
}

function resetSliders(redraw) {
  state.deltas.fill(0);
  state.deltas.forEach((_, d) => {
    const slider = $(`dim-${d}`);
    slider.value = "0";
    slider.disabled = state.result === null;
    $(`dim-${d}-value`).textContent = "+0.00";
  });
  if (redraw) decode();
}

// One request at a time; moves made meanwhile are sent as one when it returns.
async function decode() {
  if (!state.result) return;
  if (state.inflight) {
    state.pending = true;
    return;
  }
  state.inflight = true;
  setBusy(1);
  try {
    do {
      state.pending = false;
      const generation = state.generation;
      const capsule = state.result.capsules[state.shown].map((v, d) => v + state.deltas[d]);
      const start = performance.now();
      const reply = await api("/api/decode", { capsule, class_id: state.shown });
      const roundTrip = performance.now() - start;
      if (generation !== state.generation) continue;  // a new digit came meanwhile
      paintGray($("reconstruction"), reply.reconstruction);
      bumpReconstruction();
      window.explorerStats.decodeRoundTripMs.push(roundTrip);
      window.explorerStats.decodeServerMs.push(reply.server_ms.decode);
      $("latency").textContent = `last update: ${roundTrip.toFixed(0)} ms round trip,`
        + ` ${reply.server_ms.decode.toFixed(1)} ms decoding`;
    } while (state.pending);
  } catch (error) {
    status(error.message, true);
  } finally {
    state.inflight = false;
    setBusy(-1);
  }
}

function buildPicker() {
  const picker = $("class-picker");
  state.info.class_names.forEach((name, k) => {
    const option = document.createElement("option");
    option.value = String(k);
    option.textContent = name;
    picker.appendChild(option);
  });
  picker.addEventListener("change", () => {
    if (!state.result) return;
    state.shown = Number(picker.value);
    drawBars();
    drawRouting();
    resetSliders(true);
  });
}

// ---- routing -------------------------------------------------------------------
function buildRouting() {
  const box = $("routing");
  if (state.info.couplings_note) {
    $("routing-note").textContent = `Not available: ${state.info.couplings_note}`;
    return;
  }
  for (let i = 0; i < state.info.routing_iterations; i++) {
    const cell = element("div", { class: "iteration" });
    cell.append(element("canvas", { id: `routing-${i}`, width: 6, height: 6 }),
      `iteration ${i + 1}`, element("br", {}), element("span", { id: `routing-${i}-max` }));
    box.appendChild(cell);
  }
}

// Couplings stay near uniform (1/classes), so the colours show the difference:
// white is uniform, blue more, red less, on one scale for every iteration.
function drawRouting() {
  const couplings = state.result.couplings;  // [iterations][rows][columns][classes]
  if (!couplings) return;
  const uniform = 1 / state.info.class_names.length;
  let scale = 0.02;
  for (const grid of couplings) {
    for (const row of grid) {
      for (const cell of row) scale = Math.max(scale, Math.abs(cell[state.shown] - uniform));
    }
  }
  couplings.forEach((grid, i) => {
    const canvas = $(`routing-${i}`);
    if (!canvas) return;
    const rows = grid.length, columns = grid[0].length;
    canvas.width = columns;
    canvas.height = rows;
    const context = canvas.getContext("2d");
    const image = context.createImageData(columns, rows);
    let largest = 0;
    for (let y = 0; y < rows; y++) {
      for (let x = 0; x < columns; x++) {
        const value = grid[y][x][state.shown];
        largest = Math.max(largest, value);
        const t = Math.max(-1, Math.min(1, (value - uniform) / scale));
        const at = 4 * (y * columns + x);
        const [red, green, blue] = t >= 0
          ? [255 - 247 * t, 255 - 207 * t, 255 - 148 * t]   // to dark blue
          : [255 + 77 * t, 255 + 230 * t, 255 + 220 * t];   // to dark red
        image.data[at] = Math.round(red);
        image.data[at + 1] = Math.round(green);
        image.data[at + 2] = Math.round(blue);
        image.data[at + 3] = 255;
      }
    }
    context.putImageData(image, 0, 0);
    $(`routing-${i}-max`).textContent = `largest ${largest.toFixed(2)}`;
  });
  $("routing-scale").textContent = `Class ${state.info.class_names[state.shown]}: white is `
    + `${uniform.toFixed(2)} (uniform), blue above it (darkest ${(uniform + scale).toFixed(2)}),`
    + ` red below (darkest ${Math.max(0, uniform - scale).toFixed(2)}).`;
}

// ---- start ---------------------------------------------------------------------
async function start() {
  clearDrawing();
  try {
    state.info = await api("/api/info");
  } catch (error) {
    status(`Cannot reach the explorer: ${error.message}`, true);
    return;
  }
  $("source").textContent = `model: ${state.info.source}`;
  buildSliders();
  buildPicker();
  buildRouting();
  $("clear").addEventListener("click", () => {
    clearDrawing();
    status("Draw a digit (mouse or touch), or load a test digit.");
  });
  $("reset-sliders").addEventListener("click", () => resetSliders(true));
  $("random-digit").addEventListener("click", () => loadTestDigit($("digit-index").value));
  if (!state.info.test_digits) $("random-digit").disabled = true;
  const digit = new URLSearchParams(window.location.search).get("digit");
  document.body.dataset.ready = "1";
  if (digit !== null) await loadTestDigit(digit);
}

start();
