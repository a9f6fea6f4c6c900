// Diagrams at the size their labels are written in. Material for MkDocs initializes Mermaid with its own
// theme; this adds, to whatever it asks, that a diagram keeps its natural width (a wide one scrolls
// sideways, see stylesheets/extra.css) rather than shrinking its labels to fit the column.
(() => {
  if (typeof mermaid === "undefined") return; // built without docs/assets.py: Material loads it from its CDN
  const initialize = mermaid.initialize.bind(mermaid);
  mermaid.initialize = (config) =>
    initialize({
      ...config,
      flowchart: { ...(config && config.flowchart), useMaxWidth: false },
      sequence: { ...(config && config.sequence), useMaxWidth: false },
      themeVariables: { ...(config && config.themeVariables), fontSize: "16px" },
    });
})();
