/* gpuaas GPU dashboard and project view.
 *
 * Each page embeds its first data as JSON (<script id="gd-data">) and names its endpoint in
 * data-source on #gd-root; this script renders the data and re-fetches the endpoint every
 * data-refresh seconds (15), re-rendering in place: no page reload. Charts use the vendored
 * Chart.js (window.Chart), created once and updated with new points.
 *
 * Status is never shown by colour alone: tiles carry a text label and an icon, and the CSS gives
 * each status its own pattern. Everything is built with DOM calls and textContent (no innerHTML).
 */
(function () {
  "use strict";

  var root = document.getElementById("gd-root");
  var dataNode = document.getElementById("gd-data");
  if (!root || !dataNode) {
    return;
  }

  var STATUS = {
    in_use: { label: "In Use", icon: "\u25CF" },
    ready: { label: "Ready", icon: "\u25D0" },
    available: { label: "Available", icon: "\u25CB" },
    // Free but not admitted by its node's tier (TierProfilePolicy): approval never gives it out.
    tier_policy: { label: "Withheld by tier policy", icon: "\u229D" },
    unavailable: { label: "Unavailable", icon: "\u2298" }
  };
  var STATUS_ORDER = ["in_use", "ready", "available", "tier_policy", "unavailable"];
  var SHAPE_LABEL = { "1g": "1g", "2g": "2g", "3g": "3g", "4g": "4g", "7g": "7g", full: "Full" };
  var LINE_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"];
  var LINE_DASHES = [[], [6, 3], [2, 2], [8, 3, 2, 3], [12, 4], [3, 6]];

  // ------------------------------------------------------------------ DOM helpers

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) {
        var value = attrs[key];
        if (value === null || value === undefined || value === false) {
          return;
        }
        if (key === "text") {
          el.textContent = value;
        } else if (key === "className") {
          el.className = value;
        } else if (key === "style") {
          Object.keys(value).forEach(function (prop) { el.style.setProperty(prop, value[prop]); });
        } else if (key.slice(0, 2) === "on") {
          el.addEventListener(key.slice(2), value);
        } else {
          el.setAttribute(key, value === true ? "" : value);
        }
      });
    }
    for (var i = 2; i < arguments.length; i++) {
      append(el, arguments[i]);
    }
    return el;
  }

  function append(el, child) {
    if (child === null || child === undefined || child === false) {
      return;
    }
    if (Array.isArray(child)) {
      child.forEach(function (c) { append(el, c); });
    } else if (child instanceof Node) {
      el.appendChild(child);
    } else {
      el.appendChild(document.createTextNode(String(child)));
    }
  }

  function region(name) {
    return root.querySelector('[data-region="' + name + '"]');
  }

  /* Replace a region's content, keeping keyboard focus on the element with the same data-key. */
  function fill(name) {
    var el = region(name);
    if (!el) {
      return;
    }
    var active = document.activeElement;
    var key = active && el.contains(active) ? active.getAttribute("data-key") : null;
    var children = Array.prototype.slice.call(arguments, 1);
    el.replaceChildren();
    append(el, children);
    if (key) {
      var again = el.querySelector('[data-key="' + CSS.escape(key) + '"]');
      if (again) {
        again.focus();
      }
    }
  }

  // ------------------------------------------------------------------ formatting

  function num(value, digits) {
    if (value === null || value === undefined) {
      return "\u2013";
    }
    return Number(value).toLocaleString("en-GB", { maximumFractionDigits: digits === undefined ? 1 : digits });
  }

  function pct(value) {
    return value === null || value === undefined ? "\u2013" : num(value, 1) + " %";
  }

  function when(iso) {
    if (!iso) {
      return "\u2013";
    }
    var d = new Date(iso);
    return d.toISOString().slice(0, 16).replace("T", " ") + " UTC";
  }

  function clock(date) {
    return date.toISOString().slice(11, 19) + " UTC";
  }

  function statusLabel(status) {
    var s = STATUS[status];
    return s ? s.icon + " " + s.label : status;
  }

  // ------------------------------------------------------------------ shared pieces

  function unavailable(panel) {
    return h("p", { className: "gd-unavailable", text: (panel && panel.reason) || "Not available yet" });
  }

  function statusLegend() {
    return STATUS_ORDER.map(function (status) {
      return h("li", null,
        h("span", { className: "gd-swatch gd-st-" + status, "aria-hidden": "true" }),
        statusLabel(status));
    });
  }

  /* Status as a pattern over the profile colour (the "Profile" colouring and the MIG picture). */
  function patternLegend() {
    return STATUS_ORDER.map(function (status) {
      return h("li", null,
        h("span", { className: "gd-swatch gd-neutral gd-pat-" + status, "aria-hidden": "true" }),
        statusLabel(status));
    });
  }

  function shapeLegend() {
    return Object.keys(SHAPE_LABEL).map(function (shape) {
      return h("li", null, h("span", { className: "gd-swatch gd-shape-" + shape, "aria-hidden": "true" }), SHAPE_LABEL[shape]);
    });
  }

  function bar(parts, total, label) {
    var el = h("div", { className: "gd-bar", role: "img", "aria-label": label });
    if (total > 0) {
      parts.forEach(function (part) {
        if (part.value > 0) {
          el.appendChild(h("span", { className: "gd-st-" + part.status, style: { width: (100 * part.value / total) + "%" } }));
        }
      });
    }
    return el;
  }

  function stat(label, value) {
    return h("div", null, h("dt", { text: label }), h("dd", { text: value }));
  }

  function counters(health) {
    if (!health) {
      return h("p", { className: "gd-quiet", text: "Error / Throttling / Caution: health events not available yet" });
    }
    var items = [
      ["error", "\u2716", "Error"], ["throttling", "\u25BC", "Throttling"], ["caution", "\u26A0", "Caution"]
    ];
    return h("ul", { className: "gd-counters", "aria-label": "Open health events" }, items.map(function (item) {
      var n = health[item[0]] || 0;
      return h("li", { className: n ? "gd-counter-" + item[0] : "gd-counter-zero" },
        h("span", { "aria-hidden": "true", text: item[1] + " " }), item[2] + ": " + n);
    }));
  }

  function table(columns, items, caption) {
    var head = h("tr", null, columns.map(function (c) {
      return h("th", { scope: "col", className: c.num ? "gd-num" : null, text: c.label });
    }));
    var body = items.map(function (item, row) {
      return h("tr", null, columns.map(function (c) {
        var value = item[c.key];
        var content = c.render ? c.render(item) : (c.format ? c.format(value) : (value === null || value === undefined ? "\u2013" : String(value)));
        if (c.link && item[c.link] && !c.render) {
          content = h("a", { href: item[c.link], "data-key": "row-" + c.key + "-" + (item.id !== undefined ? item.id : row), text: content });
        }
        return h("td", { className: c.num ? "gd-num" : null }, content);
      }));
    });
    return h("div", { className: "gd-table-wrap" },
      h("table", { className: "gd-table" }, caption ? h("caption", { className: "gd-visually-hidden", text: caption }) : null,
        h("thead", null, head), h("tbody", null, body)));
  }

  /* A panel from the server: {available, reason} or {available, columns, items, empty, footer}. */
  function panel(p, caption) {
    if (!p || !p.available) {
      return unavailable(p);
    }
    var parts = [];
    if (p.summary) {
      parts.push(h("p", { className: "gd-quiet", text: p.summary }));
    }
    if (!p.items || !p.items.length) {
      parts.push(h("p", { className: "gd-empty", text: p.empty || "Nothing to show." }));
    } else {
      var columns = p.columns.map(function (c) {
        var col = { key: c.key, label: c.label, num: !!c.num, link: c.link };
        if (c.type === "datetime") {
          col.format = when;
        } else if (c.type === "percent") {
          col.format = pct;
        } else if (c.type === "status") {
          col.format = statusLabel;
        } else if (c.num) {
          // Money and other pre-formatted figures arrive as strings: printed as they are.
          col.format = function (v) { return typeof v === "string" ? v : num(v, c.digits === undefined ? 1 : c.digits); };
        }
        return col;
      });
      parts.push(table(columns, p.items, caption));
    }
    if (p.footer) {
      parts.push(h("p", { className: "gd-quiet", text: p.footer }));
    }
    return parts;
  }

  function profileTable(rows, statuses) {
    statuses = statuses || STATUS_ORDER;
    var columns = [{ key: "label", label: "Profile" }].concat(statuses.map(function (s) {
      return { key: s, label: statusLabel(s), num: true, format: function (v) { return num(v, 0); } };
    })).concat([
      { key: "total", label: "Total", num: true, format: function (v) { return num(v, 0); } },
      { key: "gpus", label: "GPUs", num: true, format: function (v) { return num(v, 2); } },
      {
        key: "bar", label: "Share", render: function (row) {
          return bar(statuses.map(function (s) { return { status: s, value: row[s] }; }), row.total,
            row.label + ": " + statuses.map(function (s) { return STATUS[s].label + " " + row[s]; }).join(", "));
        }
      }
    ]);
    return table(columns, rows, "Profile distribution");
  }

  /* Why units are withheld by tier policy, and where an operator changes it. */
  function tierPolicyNote(policies) {
    if (!policies || !policies.rules.length) {
      return null;
    }
    return h("p", { className: "gd-quiet" }, STATUS.tier_policy.label + ": " + policies.rules.join("; ") + ". ",
      h("a", { href: policies.admin_url, "data-key": "tier-policies", text: "Edit the tier profile policies" }));
  }

  // ------------------------------------------------------------------ charts

  var charts = {};
  var MINUTE = 60 * 1000;

  /* A round tick step (5 min .. 6 h) giving at most ~6 ticks over the panel's window (else the points' range). */
  function timeStep(series) {
    var span;
    if (series.from && series.to) {
      span = Date.parse(series.to) - Date.parse(series.from);
    } else {
      var times = [];
      series.series.forEach(function (line) { line.points.forEach(function (p) { times.push(Date.parse(p.t)); }); });
      span = times.length ? Math.max.apply(null, times) - Math.min.apply(null, times) : 0;
    }
    var steps = [5, 10, 15, 30, 60, 120, 180, 360];
    for (var i = 0; i < steps.length; i++) {
      if (span / (steps[i] * MINUTE) <= 6) {
        return steps[i] * MINUTE;
      }
    }
    return 720 * MINUTE;
  }

  function windowEdge(iso) {
    return iso ? Date.parse(iso) : undefined;
  }

  function hasData(series, key) {
    return series.series.some(function (line) {
      return line.points.some(function (p) { return p[key] !== null && p[key] !== undefined; });
    });
  }

  function chartsFor(name, series) {
    var el = region(name);
    if (!el) {
      return;
    }
    if (!series || !series.available) {
      Object.keys(charts).forEach(function (key) { if (key.indexOf(name + ":") === 0) { charts[key].destroy(); delete charts[key]; } });
      el.replaceChildren(unavailable(series));
      return;
    }
    if (typeof window.Chart !== "function") {
      el.replaceChildren(h("p", { className: "gd-unavailable", text: "The chart library did not load." }));
      return;
    }
    var grid = el.querySelector(".gd-charts");
    if (!grid) {
      grid = h("div", { className: "gd-charts" });
      el.replaceChildren(grid);
    }
    var empty = [];
    series.metrics.forEach(function (metric) {
      var key = name + ":" + metric.key;
      if (!hasData(series, metric.key)) {
        empty.push(metric.label);
        if (charts[key]) {
          charts[key].destroy();
          delete charts[key];
          var stale = grid.querySelector('[data-chart="' + metric.key + '"]');
          if (stale) {
            stale.remove();
          }
        }
        return;
      }
      var datasets = series.series.map(function (line, i) {
        return {
          label: line.label,
          data: line.points.map(function (p) { return { x: Date.parse(p.t), y: p[metric.key] === undefined ? null : p[metric.key] }; }),
          borderColor: LINE_COLOURS[i % LINE_COLOURS.length],
          backgroundColor: LINE_COLOURS[i % LINE_COLOURS.length],
          borderDash: LINE_DASHES[i % LINE_DASHES.length],
          pointStyle: ["circle", "triangle", "rect", "rectRot", "cross", "star"][i % 6],
          pointRadius: 2,
          borderWidth: 2,
          spanGaps: false
        };
      });
      var chart = charts[key];
      if (chart) {
        chart.data.datasets = datasets;
        chart.options.scales.x.min = windowEdge(series.from);
        chart.options.scales.x.max = windowEdge(series.to);
        chart.update("none");
        return;
      }
      var title = metric.label + (metric.unit ? " (" + metric.unit + ")" : "");
      var canvas = h("canvas", { role: "img", "aria-label": title + " over time, one line per " + (series.per || "series") });
      var box = h("figure", { className: "gd-chart-box", "data-chart": metric.key },
        h("figcaption", null, h("strong", { text: title })), h("div", { className: "gd-chart" }, canvas));
      grid.appendChild(box);
      charts[key] = new window.Chart(canvas, {
        type: "line",
        data: { datasets: datasets },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          parsing: true,
          interaction: { mode: "nearest", intersect: false },
          scales: {
            x: {
              type: "linear",
              // Every chart spans the panel's window, so a series that begins later is drawn where it begins.
              min: windowEdge(series.from),
              max: windowEdge(series.to),
              ticks: {
                stepSize: timeStep(series),
                maxTicksLimit: 8,
                callback: function (value) { return new Date(value).toISOString().slice(11, 16); }
              }
            },
            y: { beginAtZero: true, suggestedMax: metric.max || undefined }
          },
          plugins: {
            legend: { labels: { usePointStyle: true } },
            tooltip: {
              callbacks: {
                title: function (items) { return items.length ? when(new Date(items[0].parsed.x).toISOString()) : ""; }
              }
            }
          }
        }
      });
    });
    var note = el.querySelector(".gd-series-note") || h("p", { className: "gd-quiet gd-series-note" });
    note.textContent = (series.summary || "") +
      (empty.length ? " No readings in this window for: " + empty.join(", ") + "." : "");
    el.appendChild(note);
  }

  // ------------------------------------------------------------------ overview page

  function clusterCard(c) {
    var units = c.units;
    var ge = c.gpu_equivalents;
    var activity = c.activity;
    return h("article", { className: "gd-card", "aria-labelledby": "gd-cluster-" + c.id },
      h("div", { className: "gd-card-head" },
        h("h3", { id: "gd-cluster-" + c.id }, h("a", { href: c.url, "data-key": "cluster-" + c.id, text: c.name })),
        h("span", { className: "gd-badge gd-badge-" + c.status, text: c.status_label })),
      h("dl", { className: "gd-stats" },
        stat("GPUs", num(c.gpus, 0)),
        stat("Nodes", num(c.nodes, 0) + (c.nodes !== c.nodes_schedulable ? " (" + c.nodes_schedulable + " sched.)" : "")),
        stat("MIG instances", num(c.mig_instances, 0)),
        stat("Allocated", num(ge.allocated, 2) + " / " + num(ge.total, 2) + " GPU"),
        stat("Free", num(ge.free, 2) + " GPU"),
        stat("SM activity", activity ? pct(activity.sm_active_pct) : "no data"),
        stat("Power", activity && activity.power_w !== null ? num(activity.power_w, 0) + " W" : "no data")),
      bar(STATUS_ORDER.map(function (s) { return { status: s, value: units[s] }; }), units.total,
        "Units: " + STATUS_ORDER.map(function (s) { return STATUS[s].label + " " + units[s]; }).join(", ")),
      h("p", { className: "gd-quiet", style: { margin: "0" } },
        STATUS_ORDER.map(function (s) { return statusLabel(s) + " " + units[s]; }).join(" \u00B7 ") +
        " (allocated " + pct(c.allocated_pct) + ")"),
      counters(c.health));
  }

  /* The admin's own approve/reject actions for one request: each form opens the action's reason page. */
  function actionForms(pending, item) {
    var csrf = root.querySelector("[data-csrf]");
    return h("div", { style: { display: "flex", gap: "0.3rem", "flex-wrap": "wrap" } }, pending.actions.map(function (action) {
      return h("form", { method: "post", action: pending.action_url, style: { margin: "0" } },
        h("input", { type: "hidden", name: "csrfmiddlewaretoken", value: csrf ? csrf.value : "" }),
        h("input", { type: "hidden", name: "action", value: action.name }),
        h("input", { type: "hidden", name: "_selected_action", value: String(item.id) }),
        h("button", {
          type: "submit", className: "gd-button", "data-key": action.name + "-" + item.id,
          "aria-label": action.label.replace("\u2026", "") + " request #" + item.id, text: action.label
        }));
    }));
  }

  function renderOverview(data) {
    var t = data.totals;
    fill("totals", t.clusters + " clusters, " + t.nodes + " nodes, " + t.gpus + " GPUs, " + t.mig_instances +
      " MIG instances. " + (data.gpus_note || ""));
    fill("legend", statusLegend());
    fill("clusters", data.clusters.length ? data.clusters.map(clusterCard) :
      h("p", { className: "gd-empty", text: "No clusters registered yet." }));
    fill("profiles", profileTable(data.profiles), tierPolicyNote(data.tier_policies));
    fill("capacity_plan", panel(data.capacity_plan, "Capacity per tier"));
    fill("driver_upgrades", panel(data.driver_upgrades, "Rolling driver upgrades"));
    var pending = data.pending;
    fill("pending",
      h("p", null, pending.count + " request" + (pending.count === 1 ? "" : "s") + " waiting. ",
        h("a", { href: pending.queue_url, "data-key": "pending-queue", text: "Open the approval queue" })),
      pending.items.length ? table([
        { key: "id", label: "#", link: "url" },
        { key: "project", label: "Project" },
        { key: "spec", label: "Spec" },
        { key: "count", label: "Count", num: true },
        { key: "tier", label: "Tier" },
        { key: "requested_by", label: "By" },
        { key: "created_at", label: "Submitted", format: when }
      ].concat(pending.actions && pending.actions.length ? [{ key: "act", label: "Action", render: function (item) { return actionForms(pending, item); } }] : []),
      pending.items, "Pending approvals") : null);
    fill("health_events", panel(data.health_events, "Health events"));
    fill("idle_reservations", panel(data.idle_reservations, "Idle reservations"));
    fill("trespass_events", panel(data.trespass_events, "Trespass events"));
    fill("costs", panel(data.costs, "Cost this month by project"));
    chartsFor("series", data.series);
  }

  // ------------------------------------------------------------------ node view page

  var view = { tab: "grid", colour: "status" };
  var METRICS = {
    power_w: { label: "Power", unit: "W", min: 0, max: 700, digits: 0 },
    sm_active_pct: { label: "SM activity", unit: "%", min: 0, max: 100, digits: 0 },
    temperature_c: { label: "Temperature", unit: "\u00B0C", min: 20, max: 90, digits: 0 }
  };

  function metricValue(unit, gpu, key) {
    var m = unit && unit.metrics;
    if (m && m[key] !== null && m[key] !== undefined) {
      return { value: m[key], own: true };
    }
    var g = gpu && gpu.metrics;
    if (g && g[key] !== null && g[key] !== undefined) {
      return { value: g[key], own: false };
    }
    return null;
  }

  function metricFill(key, value) {
    var m = METRICS[key];
    var f = Math.max(0, Math.min(1, (value - m.min) / (m.max - m.min)));
    var light = Math.round(95 - f * 70);
    return { background: "hsl(212, 70%, " + light + "%)", color: light < 55 ? "#fff" : "#111" };
  }

  function unitText(unit) {
    var st = STATUS[unit.status];
    return (unit.profile || "Full GPU") + (unit.start !== undefined ? " at slice " + unit.start + ", size " + unit.size : "") +
      ": " + (unit.status === "tier_policy" ? unit.availability_label :
        st.label + (unit.status === "unavailable" ? " (" + unit.availability_label + ")" : "")) +
      (unit.project ? ", held by " + unit.project + " / " + unit.pool : "") +
      (unit.workload ? ", running " + unit.workload : "");
  }

  function unitBlock(unit, gpu, opts) {
    var st = STATUS[unit.status];
    // In the node grid a unit under 3 of 8 slices is narrow: it prints its shape ("1g") and icon only.
    var narrow = !opts.detail && unit.size !== undefined && unit.size * 8 < 3 * gpu.memory_slices;
    var label = unit.profile ? (narrow ? unit.shape_label : unit.profile) : "Full GPU";
    var cls = "gd-unit";
    var style = {};
    // The large picture prints both forms; CSS keeps the short one when its container is narrow.
    var lines = [opts.detail && unit.profile ?
      h("strong", null, h("span", { className: "gd-long", text: unit.profile }), h("span", { className: "gd-short", text: unit.shape_label })) :
      h("strong", { text: label })];
    if (opts.colour === "status") {
      cls += " gd-st-" + unit.status;
    } else if (opts.colour === "profile") {
      cls += " gd-shape-" + unit.shape + " gd-pat-" + unit.status;
    } else {
      var m = METRICS[opts.colour];
      var mv = metricValue(unit, gpu, opts.colour);
      cls += " gd-metric";
      if (mv) {
        var fillStyle = metricFill(opts.colour, mv.value);
        style.background = fillStyle.background;
        style.color = fillStyle.color;
        lines.push(h("span", { text: num(mv.value, m.digits) + (narrow ? "" : " " + m.unit + (mv.own ? "" : " (GPU)")) }));
      } else {
        lines.push(h("span", { text: narrow ? "\u2013" : "no data" }));
      }
    }
    if (opts.detail) {
      lines.push(h("span", null, h("span", { className: "gd-long", text: st.icon + " " + st.label }), h("span", { className: "gd-short", text: st.icon })));
    } else {
      lines.push(h("span", { text: narrow ? st.icon : st.icon + " " + st.label }));
    }
    if (opts.detail) {
      if (unit.project) {
        lines.push(h("span", { className: "gd-long", text: unit.project + (unit.pool ? " / " + unit.pool : "") }));
      }
      if (unit.workload) {
        lines.push(h("span", { className: "gd-long", text: unit.workload }));
      }
      if (unit.metrics) {
        var bits = [];
        if (unit.metrics.sm_active_pct !== null && unit.metrics.sm_active_pct !== undefined) {
          bits.push("SM " + num(unit.metrics.sm_active_pct, 0) + " %");
        }
        if (unit.metrics.power_w !== null && unit.metrics.power_w !== undefined) {
          bits.push(num(unit.metrics.power_w, 0) + " W");
        }
        if (bits.length) {
          lines.push(h("span", { className: "gd-long", text: bits.join(" \u00B7 ") }));
        }
      }
    }
    var text = unitText(unit);
    style["grid-column"] = unit.start !== undefined ? (unit.start + 1) + " / span " + unit.size : "1 / -1";
    style["grid-row"] = "1";
    // The visible lines are a compact picture; screen readers get the one full sentence instead.
    return h("div", { className: cls, style: style, title: text },
      h("span", { "aria-hidden": "true", className: "gd-unit-lines" }, lines),
      h("span", { className: "gd-visually-hidden", text: text }));
  }

  /* A GPU's memory slices (8, or 4 on an A30) with its MIG instances at their placements. */
  function slices(gpu, opts) {
    var n = gpu.memory_slices;
    var grid = h("div", {
      className: "gd-slices", style: { "grid-template-columns": "repeat(" + n + ", minmax(0, 1fr))" },
      role: "group", "aria-label": "GPU " + gpu.index + " memory slices"
    });
    if (!gpu.mig) {
      if (gpu.unit) {
        grid.appendChild(unitBlock(gpu.unit, gpu, opts));
      }
      return grid;
    }
    var used = new Array(n).fill(false);
    gpu.instances.forEach(function (instance) {
      for (var i = instance.start; i < instance.start + instance.size && i < n; i++) {
        used[i] = true;
      }
      grid.appendChild(unitBlock(instance, gpu, opts));
    });
    for (var i = 0; i < n; i++) {
      if (!used[i]) {
        grid.appendChild(h("div", {
          className: "gd-unit gd-st-free", style: { "grid-column": (i + 1) + " / span 1", "grid-row": "1" },
          title: "Memory slice " + i + " free (no instance)"
        }, opts.detail ? h("span", { text: "slice " + i + " free" }) : h("span", { className: "gd-visually-hidden", text: "slice " + i + " free" })));
      }
    }
    return grid;
  }

  function eventBadge(events) {
    if (!events || !events.length) {
      return null;
    }
    var critical = events.some(function (e) { return e.level === "critical"; });
    return h("span", {
      className: "gd-badge gd-badge-" + (critical ? "critical" : "warning"),
      title: events.map(function (e) { return e.level_label + ": " + e.rule; }).join("; "),
      text: (critical ? "\u2716 " : "\u26A0 ") + events.length + " event" + (events.length === 1 ? "" : "s")
    });
  }

  function gpuTile(gpu, gpuUrl) {
    var unitCount = gpu.mig ? gpu.instances.length + " MIG" : "Full";
    return h("div", { className: "gd-gpu" },
      h("div", { className: "gd-gpu-head" },
        h("a", { href: gpuUrl.replace("{id}", gpu.id), "data-key": "gpu-" + gpu.id, text: "GPU " + gpu.index }),
        h("span", { text: unitCount }),
        gpu.health !== "ok" ? h("span", { className: "gd-badge gd-badge-" + gpu.health, text: gpu.health_label }) : null,
        eventBadge(gpu.events)),
      slices(gpu, { colour: view.colour, detail: false }),
      gpu.mig && !gpu.instances.length ? h("p", { className: "gd-mig-note", text: "MIG on, no instances" }) : null);
  }

  function colourOptions(data) {
    var select = root.querySelector('[data-control="colour"]');
    if (!select || select.options.length) {
      return select;
    }
    var options = [["status", "Status"], ["profile", "Profile"]];
    Object.keys(METRICS).forEach(function (key) {
      options.push([key, METRICS[key].label + (data.metrics_available ? "" : " (not available yet)")]);
    });
    options.forEach(function (o) {
      var opt = h("option", { value: o[0], text: o[1] });
      if (o[0] in METRICS && !data.metrics_available) {
        opt.disabled = true;
      }
      select.appendChild(opt);
    });
    select.value = view.colour;
    select.addEventListener("change", function () {
      view.colour = select.value;
      render(current);
    });
    return select;
  }

  function colourLegend() {
    if (view.colour === "status") {
      return statusLegend();
    }
    if (view.colour === "profile") {
      return shapeLegend().concat(patternLegend());
    }
    var m = METRICS[view.colour];
    return [
      h("li", null, h("span", { className: "gd-swatch", style: metricFill(view.colour, m.min), "aria-hidden": "true" }), num(m.min, 0) + " " + m.unit),
      h("li", null, h("span", { className: "gd-swatch", style: metricFill(view.colour, (m.min + m.max) / 2), "aria-hidden": "true" }), num((m.min + m.max) / 2, 0) + " " + m.unit),
      h("li", null, h("span", { className: "gd-swatch", style: metricFill(view.colour, m.max), "aria-hidden": "true" }), num(m.max, 0) + " " + m.unit),
      h("li", { text: "Each tile prints its value; \u201C(GPU)\u201D = the whole GPU's reading." })
    ];
  }

  function unitRows(data) {
    var rows = [];
    data.nodes.forEach(function (node) {
      node.gpus.forEach(function (gpu) {
        var units = gpu.mig ? gpu.instances : (gpu.unit ? [gpu.unit] : []);
        units.forEach(function (unit) {
          var m = unit.metrics || gpu.metrics || {};
          rows.push({
            id: gpu.id + "-" + (unit.id || "gpu"),
            node: node.name,
            gpu: "GPU " + gpu.index,
            gpu_url: data.gpu_url.replace("{id}", gpu.id),
            unit: (unit.profile || "Full GPU") + (unit.start !== undefined ? " @" + unit.start + ":" + unit.size : ""),
            status: unit.status,
            holder: unit.project ? unit.project + " / " + unit.pool : "",
            workload: unit.workload || "",
            sm: m.sm_active_pct,
            power: m.power_w,
            health: gpu.health_label
          });
        });
      });
    });
    return rows;
  }

  function setTab(tab) {
    view.tab = tab;
    root.querySelectorAll('[role="tab"]').forEach(function (button) {
      var selected = button.getAttribute("data-tab") === tab;
      button.setAttribute("aria-selected", selected ? "true" : "false");
      button.tabIndex = selected ? 0 : -1;
      var panelEl = document.getElementById(button.getAttribute("aria-controls"));
      if (panelEl) {
        panelEl.hidden = !selected;
      }
    });
  }

  function bindTabs() {
    var tabs = Array.prototype.slice.call(root.querySelectorAll('[role="tab"]'));
    tabs.forEach(function (button, i) {
      button.addEventListener("click", function () {
        setTab(button.getAttribute("data-tab"));
        if (button.getAttribute("data-tab") !== "grid") {
          render(current);
        }
      });
      button.addEventListener("keydown", function (event) {
        var next = null;
        if (event.key === "ArrowRight") { next = tabs[(i + 1) % tabs.length]; }
        if (event.key === "ArrowLeft") { next = tabs[(i - 1 + tabs.length) % tabs.length]; }
        if (event.key === "Home") { next = tabs[0]; }
        if (event.key === "End") { next = tabs[tabs.length - 1]; }
        if (next) {
          event.preventDefault();
          next.click();
          next.focus();
        }
      });
    });
  }

  function renderCluster(data) {
    var s = data.summary;
    fill("summary",
      h("dl", { className: "gd-stats" },
        stat("Nodes", num(s.nodes, 0)), stat("GPUs", num(s.gpus, 0)), stat("MIG instances", num(s.mig_instances, 0))),
      counters(s.health));
    fill("profiles", profileTable(data.profiles), tierPolicyNote(data.tier_policies));
    colourOptions(data);
    fill("legend", colourLegend());
    fill("grid", data.nodes.length ? data.nodes.map(function (node) {
      return h("article", { className: "gd-node", "aria-labelledby": "gd-node-" + node.id },
        h("div", { className: "gd-node-head" },
          h("h3", { id: "gd-node-" + node.id, text: node.name }),
          h("span", { className: "gd-badge" + (node.ready && !node.cordoned ? " gd-badge-ok" : " gd-badge-warning"),
            text: node.cordoned ? "Cordoned" : (node.ready ? "Ready" : "Not ready") })),
        h("div", { className: "gd-quiet", style: { "font-size": "0.8rem" } },
          [node.gpu_product, node.tier, node.mig_config].filter(Boolean).join(" \u00B7 ")),
        node.gpus.map(function (gpu) { return gpuTile(gpu, data.gpu_url); }));
    }) : h("p", { className: "gd-empty", text: "No nodes discovered on this cluster yet." }));
    if (view.tab === "table") {
      fill("table", table([
        { key: "node", label: "Node" },
        { key: "gpu", label: "GPU", link: "gpu_url" },
        { key: "unit", label: "Unit" },
        { key: "status", label: "Status", format: statusLabel },
        { key: "holder", label: "Project / pool" },
        { key: "workload", label: "Workload" },
        { key: "sm", label: "SM %", num: true, format: function (v) { return num(v, 0); } },
        { key: "power", label: "Power W", num: true, format: function (v) { return num(v, 0); } },
        { key: "health", label: "Health" }
      ], unitRows(data), "Units"));
    }
    var p = data.page;
    fill("pages", p.pages > 1 ? h("p", null, "Nodes page " + p.number + " of " + p.pages + ": ",
      Array.from({ length: p.pages }, function (_, i) {
        var n = i + 1;
        return n === p.number ? h("strong", { "aria-current": "page", text: String(n) + " " }) :
          [h("a", { href: "?page=" + n, text: String(n) }), " "];
      })) : null);
    chartsFor("series", data.series);
  }

  // ------------------------------------------------------------------ GPU page

  function renderGpu(data) {
    var gpu = data.gpu;
    fill("legend", shapeLegend().concat(patternLegend()));
    var n = gpu.memory_slices;
    var ruler = h("div", { className: "gd-ruler", style: { "grid-template-columns": "repeat(" + n + ", minmax(0, 1fr))" }, "aria-hidden": "true" },
      Array.from({ length: n }, function (_, i) { return h("span", { text: "slice " + i }); }));
    fill("picture", h("div", { className: "gd-picture" },
      h("p", null, gpu.product + " \u00B7 " + (gpu.mig ? "MIG on, " + gpu.instances.length + " instance(s) over " + n + " memory slices" : "MIG off (whole GPU)") +
        (gpu.mig_pending !== gpu.mig ? " \u00B7 MIG mode change pending" : "")),
      ruler, slices(gpu, { colour: "profile", detail: true })));
    var units = gpu.mig ? gpu.instances : (gpu.unit ? [gpu.unit] : []);
    fill("units", units.length ? table([
      { key: "profile", label: "Profile", render: function (u) { return u.profile || "Full GPU"; } },
      { key: "placement", label: "Placement", render: function (u) { return u.start !== undefined ? u.start + ":" + u.size : "\u2013"; } },
      { key: "status", label: "Status", format: statusLabel },
      { key: "project", label: "Project" },
      { key: "pool", label: "Pool" },
      { key: "workload", label: "Workload" },
      { key: "memory_mib", label: "Memory MiB", num: true, format: function (v) { return num(v, 0); } },
      { key: "multiprocessors", label: "SMs", num: true, format: function (v) { return num(v, 0); } },
      { key: "uuid", label: "UUID", render: function (u) { return h("span", { className: "gd-mono", text: u.uuid || "\u2013" }); } }
    ], units, "Instances") : h("p", { className: "gd-empty", text: "No instances." }));
    fill("specs", h("dl", { className: "gd-stats" },
      stat("Node", data.node.name), stat("Index", String(gpu.index)), stat("Health", gpu.health_label),
      stat("Memory", num(gpu.memory_mib, 0) + " MiB"), stat("Driver", gpu.driver_version || "\u2013"),
      stat("CUDA", gpu.cuda_version || "\u2013"), stat("PCI bus", gpu.pci_bus_id || "\u2013"),
      stat("Serial", gpu.serial || "\u2013"), stat("Last seen", when(gpu.last_seen_at))),
      h("p", { className: "gd-mono", text: gpu.uuid }),
      gpu.events.length ? h("ul", { className: "gd-events", "aria-label": "Open health events" }, gpu.events.map(function (e) {
        return h("li", { text: (e.level === "critical" ? "\u2716 " : "\u26A0 ") + e.level_label + ": " + e.rule + (e.mig_instance_id ? " (MIG instance)" : "") });
      })) : h("p", { className: "gd-quiet", text: "No open health events." }));
    chartsFor("series", data.series);
  }

  // ------------------------------------------------------------------ project pool page

  function renderPool(data) {
    chartsFor("series", data);
  }

  function bindPoolTabs() {
    var tabs = Array.prototype.slice.call(root.querySelectorAll('[role="tab"]'));
    tabs.forEach(function (button, i) {
      button.addEventListener("click", function () {
        setTab(button.getAttribute("data-tab"));
        // Charts sized while hidden have no width: let Chart.js measure again.
        Object.keys(charts).forEach(function (key) { charts[key].resize(); });
      });
      button.addEventListener("keydown", function (event) {
        var next = null;
        if (event.key === "ArrowRight") { next = tabs[(i + 1) % tabs.length]; }
        if (event.key === "ArrowLeft") { next = tabs[(i - 1 + tabs.length) % tabs.length]; }
        if (next) {
          event.preventDefault();
          next.click();
          next.focus();
        }
      });
    });
  }

  // ------------------------------------------------------------------ refresh loop

  var pages = { overview: renderOverview, cluster: renderCluster, gpu: renderGpu, pool: renderPool };
  var page = root.getAttribute("data-page");
  var source = root.getAttribute("data-source");
  var refreshS = parseInt(root.getAttribute("data-refresh"), 10) || 15;
  var current = JSON.parse(dataNode.textContent);
  var paused = false;
  var timer = null;
  var lastOk = new Date();

  function render(data) {
    current = data;
    pages[page](data);
  }

  function say(text) {
    var el = region("refresh");
    if (el) {
      el.textContent = text;
    }
  }

  function schedule() {
    clearTimeout(timer);
    if (!paused) {
      timer = setTimeout(poll, refreshS * 1000);
    }
  }

  function poll() {
    fetch(source, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (response) {
        if (!response.ok || (response.headers.get("Content-Type") || "").indexOf("application/json") !== 0) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        lastOk = new Date();
        render(data);
        say("Updated " + clock(lastOk) + "; refreshes every " + refreshS + " s.");
      })
      .catch(function (error) {
        say("Refresh failed (" + error.message + ") at " + clock(new Date()) + "; showing data from " + clock(lastOk) + ". Retrying in " + refreshS + " s.");
      })
      .then(schedule);
  }

  var pause = root.querySelector('[data-action="pause"]');
  if (pause) {
    pause.addEventListener("click", function () {
      paused = !paused;
      pause.setAttribute("aria-pressed", paused ? "true" : "false");
      pause.textContent = paused ? "Resume refresh" : "Pause refresh";
      if (paused) {
        clearTimeout(timer);
        say("Refresh paused; showing data from " + clock(lastOk) + ".");
      } else {
        poll();
      }
    });
  }

  if (page === "cluster") {
    bindTabs();
  } else if (page === "pool") {
    bindPoolTabs();
  }
  render(current);
  say("Updated " + clock(lastOk) + "; refreshes every " + refreshS + " s.");
  schedule();
  root.setAttribute("data-ready", "true");

  // Exposed for the browser tests: how many refreshes have rendered.
  window.gpuaasDashboard = { poll: poll, current: function () { return current; } };
})();
