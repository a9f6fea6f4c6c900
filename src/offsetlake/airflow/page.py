"""The offsetlake view's page (a Jinja template, autoescaped): plain HTML and an inline SVG chart, no build step.

Cells that tests and users compare with `offsetlake status --json` carry `data-testid`s.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="15">
<title>offsetlake</title>
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #1a202c; background: #fff; }
 h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 24px 0 6px; }
 h3 { font-size: 14px; margin: 14px 0 4px; }
 table { border-collapse: collapse; margin: 4px 0 8px; }
 th, td { border-bottom: 1px solid #e2e8f0; padding: 3px 10px; text-align: right; vertical-align: top; }
 th { background: #f7fafc; } td.l, th.l { text-align: left; }
 .muted { color: #718096; } .ok { color: #2f855a; } .bad { color: #c53030; font-weight: 600; }
 .lagline { stroke: #c53030; fill: none; stroke-width: 1.5; } .rowline { stroke: #3182ce; fill: none; stroke-width: 1.5; }
 .summary span { margin-right: 18px; } a { color: #3182ce; }
 svg { border: 1px solid #e2e8f0; background: #fcfcfd; }
</style></head>
<body>
<h1>offsetlake</h1>
<div class="muted">Kafka to Delta, exactly once. As of {{ now }}; reloads every 15 s.</div>
{% if note %}<p class="muted" data-testid="note">{{ note }}</p>{% endif %}
{% for p in pipelines %}
<section id="pipeline-{{ p.pipeline }}" data-testid="pipeline" data-pipeline="{{ p.pipeline }}">
 <h2>{{ p.pipeline }}</h2>
 <div class="summary">
  <span>mode <b>{{ p.mode }}</b></span><span>format <b>{{ p.format }}</b></span>
  <span>topics <b>{{ p.topics | join(", ") }}</b></span>
  <span>table version <b data-testid="version">{{ p.version if p.version is not none else "-" }}</b></span>
  <span>total lag <b data-testid="total-lag">{{ p.total_lag }}</b></span>
 </div>
 <div class="muted">table {{ p.table }}</div>
 {% if p.tables %}
 <h3>Tables (one per topic)</h3>
 <table data-testid="tables"><tr><th class="l">table</th><th class="l">path</th><th>version</th><th>lag</th></tr>
 {% for t in p.tables %}
  <tr data-testid="table" data-table="{{ t.name }}"><td class="l">{{ t.name }}</td><td class="l muted">{{ t.path }}</td>
   <td data-testid="table-version">{{ t.version if t.version is not none else "-" }}</td>
   <td data-testid="table-lag">{{ t.lag }}</td></tr>
 {% endfor %}
 </table>
 {% endif %}
 {% if p.error %}<p class="bad" data-testid="error">{{ p.error }}</p>{% endif %}
 <div>last audit:
 {% if p.audit %}<span class="{{ 'ok' if p.audit.state == 'success' else 'bad' }}" data-testid="audit">{{ p.audit.verdict }}</span>
  <span class="muted">({{ p.audit.when }}, <a href="/dags/{{ p.audit.dag_id }}/runs/{{ p.audit.run_id | urlencode }}" target="_top">run</a>)</span>
 {% else %}<span class="muted" data-testid="audit">never run (trigger {{ p.dags[3] }})</span>{% endif %}
 </div>
 <div>DAGs: {% for d in p.dags %}<a href="/dags/{{ d }}" target="_top">{{ d.split("__")[2] }}</a>{{ " · " if not loop.last }}{% endfor %}</div>

 <h3>Lag per partition</h3>
 <table data-testid="lag-table"><tr><th class="l">topic</th><th>partition</th><th>committed (ledger)</th>
  <th>log start</th><th>end (LSO)</th><th>lag</th></tr>
 {% for r in p.partitions %}
  <tr data-testid="partition" data-topic="{{ r.topic }}" data-partition="{{ r.partition }}">
   <td class="l">{{ r.topic }}</td><td>{{ r.partition }}</td>
   <td data-testid="committed">{{ r.committed if r.committed is not none else "-" }}</td>
   <td>{{ r.log_start }}</td><td data-testid="end">{{ r.end }}</td><td data-testid="lag">{{ r.lag }}</td></tr>
 {% endfor %}
 </table>

 <h3>Lag and ingested rows over the recent batches</h3>
 {% set c = chart(p.chart) %}
 {% if c.lag %}
 <svg data-testid="chart" width="{{ c.width }}" height="{{ c.height }}" viewBox="0 0 {{ c.width }} {{ c.height }}">
  <polyline class="lagline" points="{{ c.lag }}"/><polyline class="rowline" points="{{ c.committed }}"/>
 </svg>
 <div class="muted"><span style="color:#c53030">&#9632;</span> lag when each batch was planned (max {{ c.max_lag }})
  &nbsp; <span style="color:#3182ce">&#9632;</span> rows ingested (up to {{ c.max_committed }}),
  {{ c.from }} to {{ c.to }}</div>
 {% else %}<p class="muted" data-testid="chart">not enough batches yet for a chart</p>{% endif %}

 <h3>Recent commits</h3>
 <table data-testid="commits"><tr><th>version</th><th class="l">time</th><th class="l">kind</th><th>batch</th>
  <th>rows</th><th>quarantined</th><th>seconds</th><th>conflicts</th><th class="l">ranges [start, end)</th><th class="l">by</th></tr>
 {% for h in p.commits %}
  <tr data-testid="commit" data-version="{{ h.version }}"><td>{{ h.version }}</td><td class="l">{{ h.time }}</td>
   <td class="l" data-testid="kind">{{ h.kind }}</td><td>{{ h.batch if h.batch is not none else "-" }}</td>
   <td data-testid="rows">{{ h.rows }}</td><td data-testid="quarantined">{{ h.quarantined }}</td>
   <td>{{ h.seconds if h.seconds is not none else "" }}</td><td>{{ h.conflicts }}</td>
   <td class="l" data-testid="ranges">{{ h.ranges_text }}</td>
   <td class="l muted">{{ h.by }}</td></tr>
 {% else %}<tr><td colspan="10" class="muted l">no commits yet</td></tr>{% endfor %}
 </table>
</section>
{% endfor %}
</body></html>
"""
