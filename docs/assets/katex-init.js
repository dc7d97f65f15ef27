// Render the math that pymdownx.arithmatex (generic mode) leaves as \( .. \) and \[ .. \]
// in elements of class "arithmatex", with the KaTeX copy served from this site.
(function () {
  function render(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, {
        delimiters: [
          { left: "\\(", right: "\\)", display: false },
          { left: "\\[", right: "\\]", display: true },
        ],
        throwOnError: false,
      });
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(function () { render(document.body); });  // Material, incl. instant loading
  } else {
    document.addEventListener("DOMContentLoaded", function () { render(document.body); });
  }
})();
