"""The offsetlake view's page (a Jinja template, autoescaped): Airflow's look, its charts drawn by uPlot.

The page is the same HTML with or without JavaScript (every figure is also in a table); `offsetlake-view.js`
draws the charts from each pipeline's JSON (`series`, the view's own `_pipeline_view`) and takes Airflow's
colours and colour mode from the UI around it. Cells that tests and users compare with
`offsetlake status --json` carry `data-testid`s.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="30">
<title>offsetlake</title>
<script src="{{ static }}/offsetlake-theme.js"></script>
<link rel="stylesheet" href="{{ static }}/vendor/uPlot.min.css">
<link rel="stylesheet" href="{{ static }}/offsetlake-view.css">
</head>
<body>
<header class="page-head">
 <h1>offsetlake</h1>
 <span class="muted">Kafka to Delta, exactly once · as of {{ now }} · reloads every 30 s</span>
</header>
{% if note %}<p class="muted" data-testid="note">{{ note }}</p>{% endif %}
{% for p in pipelines %}
<section class="pipeline" id="pipeline-{{ p.pipeline }}" data-testid="pipeline" data-pipeline="{{ p.pipeline }}">
 <div class="pipeline-head">
  <h2>{{ p.pipeline }}</h2>
  <span class="badge">{{ p.mode }}</span><span class="badge">{{ p.format }}</span>
  {% for d in p.dags %}<a class="dag" href="/dags/{{ d }}" target="_top">{{ d.split("__")[2] }}</a>{% endfor %}
 </div>
 <div class="muted small">topics {{ p.topics | join(", ") }} · table {{ p.table }}</div>
 {% if p.error %}<p class="bad" data-testid="error">{{ p.error }}</p>{% endif %}
 <div class="stats">
  <div class="stat"><div class="stat-label">total lag</div>
   <div class="stat-value" data-testid="total-lag">{{ p.total_lag }}</div><div class="stat-unit">records</div></div>
  <div class="stat"><div class="stat-label">table version</div>
   <div class="stat-value" data-testid="version">{{ p.version if p.version is not none else "-" }}</div>
   <div class="stat-unit">{{ "one table per topic" if p.tables else "Delta" }}</div></div>
  <div class="stat"><div class="stat-label">last audit</div>
   {% if p.audit %}<div class="stat-value {{ 'ok' if p.audit.state == 'success' else 'bad' }}" data-testid="audit">{{ p.audit.verdict }}</div>
   <div class="stat-unit">{{ p.audit.when }} · <a href="/dags/{{ p.audit.dag_id }}/runs/{{ p.audit.run_id | urlencode }}" target="_top">run</a></div>
   {% else %}<div class="stat-value muted" data-testid="audit">never run</div><div class="stat-unit">trigger {{ p.dags[3] }}</div>{% endif %}
  </div>
 </div>

 <div class="charts">
  <figure class="chart" data-chart="lag"><figcaption>Lag when each batch was planned</figcaption><div class="plot"></div></figure>
  <figure class="chart" data-chart="rows_per_second"><figcaption>Rows per second of each batch</figcaption><div class="plot"></div></figure>
  <figure class="chart" data-chart="seconds"><figcaption>Batch duration</figcaption><div class="plot"></div></figure>
  <figure class="chart" data-chart="quarantined"><figcaption>Quarantined records per batch</figcaption><div class="plot"></div></figure>
  <figure class="chart" data-chart="partition_lag"><figcaption>Lag per partition now</figcaption><div class="plot"></div></figure>
 </div>
 <script type="application/json" class="series">{{ {"series": p.series, "partitions": p.partitions} | tojson }}</script>

 {% if p.tables %}
 <h3>Tables (one per topic)</h3>
 <table data-testid="tables"><thead><tr><th class="l">table</th><th class="l">path</th><th>version</th><th>lag</th></tr></thead>
 {% for t in p.tables %}
  <tr data-testid="table" data-table="{{ t.name }}"><td class="l">{{ t.name }}</td><td class="l muted">{{ t.path }}</td>
   <td data-testid="table-version">{{ t.version if t.version is not none else "-" }}</td>
   <td data-testid="table-lag">{{ t.lag }}</td></tr>
 {% endfor %}
 </table>
 {% endif %}

 <h3>Lag per partition</h3>
 <table data-testid="lag-table"><thead><tr><th class="l">topic</th><th>partition</th><th>committed (ledger)</th>
  <th>log start</th><th>end (LSO)</th><th>lag</th></tr></thead>
 {% for r in p.partitions %}
  <tr data-testid="partition" data-topic="{{ r.topic }}" data-partition="{{ r.partition }}">
   <td class="l">{{ r.topic }}</td><td>{{ r.partition }}</td>
   <td data-testid="committed">{{ r.committed if r.committed is not none else "-" }}</td>
   <td>{{ r.log_start }}</td><td data-testid="end">{{ r.end }}</td><td data-testid="lag">{{ r.lag }}</td></tr>
 {% endfor %}
 </table>

 <h3>Audits</h3>
 <table data-testid="audits"><thead><tr><th class="l">finished</th><th class="l">result</th><th class="l">run</th></tr></thead>
 {% for a in p.audits %}
  <tr data-testid="audit-run"><td class="l">{{ a.when }}</td>
   <td class="l"><span class="state state-{{ a.state }}">{{ a.verdict }}</span></td>
   <td class="l"><a href="/dags/{{ a.dag_id }}/runs/{{ a.run_id | urlencode }}" target="_top">{{ a.run_id }}</a></td></tr>
 {% else %}<tr><td colspan="3" class="muted l">no audit yet: trigger {{ p.dags[3] }}</td></tr>{% endfor %}
 </table>

 <h3>Recent commits</h3>
 <table data-testid="commits"><thead><tr><th>version</th><th class="l">time</th><th class="l">kind</th><th>batch</th>
  <th>rows</th><th>quarantined</th><th>seconds</th><th>conflicts</th><th class="l">ranges [start, end)</th><th class="l">by</th></tr></thead>
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
<script src="{{ static }}/vendor/uPlot.iife.min.js"></script>
<script src="{{ static }}/offsetlake-view.js"></script>
</body></html>
"""
