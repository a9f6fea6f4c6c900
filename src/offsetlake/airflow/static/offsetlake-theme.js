/* The offsetlake view takes Airflow's look: its colour mode and its theme's colours and font.
 *
 * Inside the Airflow UI the view is an iframe of the same origin, so it reads the UI's own settings: the
 * colour mode is the `dark` or `light` class Airflow's theme puts on its <html> (kept in localStorage under
 * `theme`), and the colours are the Chakra UI tokens Airflow defines as CSS variables there. Opened on its
 * own, the view follows the same stored setting, else the system's. This runs before the page paints and
 * again whenever Airflow's mode changes; `offsetlake:theme` tells the charts to redraw. */
(function () {
  "use strict";
  // Our variable: Airflow's token (Chakra UI's CSS variables, prefix `chakra`).
  var TOKENS = {
    "--ol-bg": "--chakra-colors-bg",
    "--ol-bg-subtle": "--chakra-colors-bg-subtle",
    "--ol-bg-muted": "--chakra-colors-bg-muted",
    "--ol-fg": "--chakra-colors-fg",
    "--ol-fg-muted": "--chakra-colors-fg-muted",
    "--ol-border": "--chakra-colors-border",
    "--ol-brand": "--chakra-colors-brand-fg",
    "--ol-success": "--chakra-colors-success-fg",
    "--ol-failed": "--chakra-colors-failed-fg",
    "--ol-running": "--chakra-colors-running-fg",
    "--ol-font": "--chakra-fonts-body",
  };

  function airflowRoot() {
    try {
      return window.parent !== window ? window.parent.document.documentElement : null;
    } catch (err) {
      return null; // another origin: not Airflow's page
    }
  }

  function mode(root) {
    if (root && (root.classList.contains("dark") || root.classList.contains("light"))) {
      return root.classList.contains("dark") ? "dark" : "light";
    }
    var stored = null;
    try {
      stored = window.localStorage.getItem("theme");
    } catch (err) {}
    if (stored === "dark" || stored === "light") return stored;
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  function apply() {
    var root = airflowRoot();
    var mine = document.documentElement;
    var theirs = root ? window.parent.getComputedStyle(root) : null;
    mine.setAttribute("data-theme", mode(root));
    Object.keys(TOKENS).forEach(function (ours) {
      var value = theirs ? theirs.getPropertyValue(TOKENS[ours]).trim() : "";
      if (value) mine.style.setProperty(ours, value);
      else mine.style.removeProperty(ours);
    });
    document.dispatchEvent(new CustomEvent("offsetlake:theme"));
  }

  apply();
  var root = airflowRoot();
  if (root && window.MutationObserver) {
    new MutationObserver(apply).observe(root, { attributes: true, attributeFilter: ["class", "style"] });
  }
  window.addEventListener("storage", function (event) {
    if (event.key === "theme") apply();
  });
})();
