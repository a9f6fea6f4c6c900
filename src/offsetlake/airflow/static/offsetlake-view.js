/* The offsetlake view's charts, drawn by uPlot from each pipeline's JSON (the page's `series` script):
 * per table, per ingest commit, the lag when the batch was planned, its rows per second, its duration and
 * its quarantined records; and the lag of each partition now. Time is UTC, as the rest of the page.
 * Each chart is at `window.offsetlakeCharts[pipeline][chart]` (its uPlot instance: `.data`, `.series`). */
(function () {
  "use strict";
  var HEIGHT = 210;
  var CHARTS = {
    lag: { unit: "lag (records)", field: "lag", kind: "line" },
    rows_per_second: { unit: "rows/s", field: "rows_per_second", kind: "line" },
    seconds: { unit: "seconds", field: "seconds", kind: "line" },
    quarantined: { unit: "records", field: "quarantined", kind: "bars" },
  };
  window.offsetlakeCharts = {};

  function colours() {
    var style = getComputedStyle(document.documentElement);
    var get = function (name) { return style.getPropertyValue(name).trim(); };
    return {
      fg: get("--ol-fg"), muted: get("--ol-fg-muted"), border: get("--ol-border"), font: get("--ol-font"),
      series: [get("--ol-brand"), get("--ol-running"), get("--ol-success"), get("--ol-failed"),
               "oklch(0.705 0.213 47.604)", "oklch(0.606 0.25 292.717)"],
    };
  }

  function number(value) {
    if (value === null || value === undefined) return "–";
    return Math.abs(value) >= 100 ? Math.round(value).toLocaleString("en-US")
      : (+value.toPrecision(3)).toLocaleString("en-US");
  }

  function utc(ts) { return new Date(ts * 1e3).toISOString().slice(0, 19).replace("T", " ") + " UTC"; }

  // Time ticks as Airflow shows time, 24-hour UTC (with seconds when ticks are less than a minute apart); the
  // date under the first tick of each day.
  function clock(u, splits) {
    var previous = null;
    var end = splits.length > 1 && splits[1] - splits[0] < 60 ? 19 : 16;
    return splits.map(function (ts) {
      var at = new Date(ts * 1e3).toISOString();
      var day = at.slice(0, 10);
      var label = day !== previous ? at.slice(11, end) + "\n" + day : at.slice(11, end);
      previous = day;
      return label;
    });
  }

  function fromZero(u, min, max) { return uPlot.rangeNum(0, max > 0 ? max : 1, 0.1, true); }

  function axis(c, label, values) {
    var font = "12px " + c.font;
    var out = { stroke: c.muted, grid: { stroke: c.border, width: 1 }, ticks: { stroke: c.border, width: 1 },
                label: label, labelSize: 18, labelFont: font, font: font, size: 56 };
    if (values) out.values = values;
    return out;
  }

  function options(c, width, xLabel, unit, labels, bars) {
    var x = axis(c, xLabel, null);
    x.size = 40;
    var y = axis(c, unit, function (u, splits) { return splits.map(number); });
    var opts = {
      width: width, height: HEIGHT, axes: [x, y], legend: { live: true },
      cursor: { points: { size: 7 } }, series: [{}].concat(labels.map(function (label, i) {
        var colour = c.series[i % c.series.length];
        var s = { label: label, stroke: colour, width: 2, value: function (u, v) { return number(v); },
                  points: { show: true, size: 5, fill: colour }, spanGaps: true };
        if (bars) {
          s.paths = uPlot.paths.bars({ size: [0.6, 48] });
          s.fill = colour;
          s.points = { show: false };
        }
        return s;
      })),
    };
    return opts;
  }

  function timeChart(element, c, chart, tables) {
    var names = Object.keys(tables).filter(function (n) { return tables[n].length; });
    if (!names.length) return null;
    var data = uPlot.join(names.map(function (n) {
      return [tables[n].map(function (p) { return p.t; }), tables[n].map(function (p) { return p[chart.field]; })];
    }));
    var opts = options(c, element.clientWidth, "time (UTC)", chart.unit, names, chart.kind === "bars");
    opts.scales = { x: { time: true }, y: { range: fromZero } };
    opts.axes[0].values = clock;
    opts.series[0] = { label: "time", value: function (u, ts) { return ts === null ? "–" : utc(ts); } };
    return new uPlot(opts, data, element);
  }

  function partitionChart(element, c, partitions) {
    if (!partitions.length) return null;
    var labels = partitions.map(function (p) {
      var topic = p.topic.length > 24 ? "…" + p.topic.slice(-23) : p.topic;
      return topic + "[" + p.partition + "]";
    });
    var data = [partitions.map(function (p, i) { return i; }), partitions.map(function (p) { return p.lag; })];
    var opts = options(c, element.clientWidth, "partition", "lag (records)", ["lag"], true);
    opts.scales = { x: { time: false, range: function () { return [-0.5, partitions.length - 0.5]; } },
                    y: { range: fromZero } };
    opts.axes[0].values = function (u, splits) {
      return splits.map(function (v) { return Number.isInteger(v) && labels[v] !== undefined ? labels[v] : ""; });
    };
    opts.axes[0].splits = function () { return data[0]; };
    opts.series[0] = { label: "partition", value: function (u, v) { return v === null ? "–" : labels[v]; } };
    return new uPlot(opts, data, element);
  }

  function draw() {
    var c = colours();
    document.querySelectorAll("section.pipeline").forEach(function (section) {
      var name = section.getAttribute("data-pipeline");
      var given = JSON.parse(section.querySelector("script.series").textContent);
      var drawn = window.offsetlakeCharts[name] || {};
      Object.keys(drawn).forEach(function (key) { if (drawn[key]) drawn[key].destroy(); });
      drawn = window.offsetlakeCharts[name] = {};
      section.querySelectorAll("figure.chart").forEach(function (figure) {
        var key = figure.getAttribute("data-chart");
        var plot = figure.querySelector(".plot");
        plot.textContent = "";
        var chart = key === "partition_lag" ? partitionChart(plot, c, given.partitions)
          : timeChart(plot, c, CHARTS[key], given.series);
        if (chart === null) {
          var empty = document.createElement("div");
          empty.className = "empty";
          empty.textContent = key === "partition_lag" ? "no partition read yet" : "no batch committed yet";
          plot.appendChild(empty);
        }
        drawn[key] = chart;
      });
    });
  }

  function resize() {
    Object.keys(window.offsetlakeCharts).forEach(function (name) {
      var drawn = window.offsetlakeCharts[name];
      Object.keys(drawn).forEach(function (key) {
        var chart = drawn[key];
        if (chart) chart.setSize({ width: chart.root.parentNode.clientWidth, height: HEIGHT });
      });
    });
  }

  draw();
  document.addEventListener("offsetlake:theme", draw);
  window.addEventListener("resize", resize);
})();
