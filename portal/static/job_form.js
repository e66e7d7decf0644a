// The New job page's live quote: as the form's fields change, fetch the quote and the
// sbatch line for them (the script stays in the page) and show them in #preview. A file
// of the portal's own, as its Content-Security-Policy (script-src 'self') requires; without
// it the "Price it" button draws the same preview with a reload.
"use strict";
(function () {
  var form = document.getElementById("job-form");
  var preview = document.getElementById("preview");
  if (!form || !preview) {
    return;
  }
  var skipped = { script: true, csrf_token: true, request_key: true, action: true };
  var asked = 0;
  var timer = null;
  function refresh() {
    var query = new URLSearchParams();
    new FormData(form).forEach(function (value, key) {
      if (!skipped[key]) {
        query.append(key, value);
      }
    });
    var mine = ++asked;
    fetch(form.dataset.previewUrl + "?" + query.toString(), { credentials: "same-origin" })
      .then(function (answer) { return answer.text(); })
      .then(function (html) {
        if (mine === asked) {  // an older answer never overwrites a newer one
          preview.innerHTML = html;
        }
      });
  }
  form.addEventListener("input", function () {
    clearTimeout(timer);
    timer = setTimeout(refresh, 250);
  });
  form.addEventListener("change", refresh);
})();
