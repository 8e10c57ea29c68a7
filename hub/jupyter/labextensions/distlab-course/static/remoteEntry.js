/*
 * The course hub's JupyterLab plugins (hub/jupyter/labextensions/distlab-course).
 *
 * Written by hand, with no build step: JupyterLab loads a prebuilt extension by running this
 * script and asking the container it registers in window._JUPYTERLAB for "./extension" (the
 * module-federation protocol of JupyterLab 4's bootstrap). The plugins import nothing: they
 * use the application's command registry and the server's page configuration only.
 *
 * 1. distlab-course:time-limit-warning. Every 30 s it asks the server how long its Slurm job
 *    has left (GET <base>/course/time-left, hub/jupyter/course_clock.py) and, once that is
 *    less than the warning time, shows one notification that stays until dismissed.
 * 2. distlab-course:open-feedback. nbgrader's Assignments tab (0.9.6) turns "(view feedback)"
 *    into app.commands.execute("filebrowser:go-to-path", {path: "<assignment>/feedback/<time>"}),
 *    which only moves the file browser into that folder. This plugin opens the feedback page
 *    instead (GET <base>/course/feedback/<that folder>, hub/jupyter/course_feedback.py), in a
 *    new browser tab, for exactly that call and no other.
 */
(function () {
  "use strict";

  function pageConfig() {
    var el = document.getElementById("jupyter-config-data");
    return el ? JSON.parse(el.textContent || "{}") : {};
  }

  function baseUrl() {
    var base = pageConfig().baseUrl || "/";
    return base.endsWith("/") ? base : base + "/";
  }

  function getJSON(path) {
    var headers = {};
    var token = pageConfig().token;
    if (token) {
      headers.Authorization = "token " + token;
    }
    return fetch(baseUrl() + path, { credentials: "same-origin", headers: headers }).then(function (r) {
      return r.ok ? r.json() : null;
    });
  }

  function clock(secondsFromNow) {
    var end = new Date(Date.now() + secondsFromNow * 1000);
    return end.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
  }

  var timeLimitWarning = {
    id: "distlab-course:time-limit-warning",
    description: "Warns before the server's Slurm job reaches its time limit.",
    autoStart: true,
    activate: function (app) {
      var warned = false;
      function check() {
        if (warned) {
          return;
        }
        getJSON("course/time-left").then(function (info) {
          if (!info || info.seconds_left === null || info.seconds_left > info.warn_seconds || warned) {
            return;
          }
          warned = true;
          var minutes = Math.max(1, Math.round(info.seconds_left / 60));
          app.commands.execute("apputils:notify", {
            type: "warning",
            // JupyterLab cuts a notification after 140 characters: this one fits.
            message:
              "Your server ends in about " + minutes + " minute" + (minutes === 1 ? "" : "s") +
              " (at " + clock(info.seconds_left) + "), its time limit. Save your notebooks: files stay, " +
              "kernels end.",
            options: { autoClose: false }
          });
        }).catch(function () { /* the next check asks again */ });
      }
      check();
      window.setInterval(check, 30000);
    }
  };

  var FEEDBACK_FOLDER = /^(?:[^/]+\/)*[^/]+\/feedback\/[^/]+\/?$/;

  var openFeedback = {
    id: "distlab-course:open-feedback",
    description: "The Assignments tab's 'view feedback' opens the feedback page.",
    autoStart: true,
    activate: function (app) {
      var commands = app.commands;
      var execute = commands.execute.bind(commands);
      commands.execute = function (id, args) {
        var path = args && args.path;
        if (id === "filebrowser:go-to-path" && typeof path === "string" && FEEDBACK_FOLDER.test(path) &&
            isAssignmentsClick()) {
          var url = baseUrl() + "course/feedback/" + path.split("/").map(encodeURIComponent).join("/");
          window.open(url, "_blank");
          return Promise.resolve();
        }
        return execute(id, args);
      };
    }
  };

  // Only a click on nbgrader's own "(view feedback)" link, in the Assignments tab, is redirected.
  function isAssignmentsClick() {
    var event = window.event;
    var target = event && event.target;
    return !!(target && target.closest && target.closest("#submitted_assignments_list"));
  }

  var plugins = [timeLimitWarning, openFeedback];
  var container = {
    init: function () { /* shares no modules */ },
    get: function (module) {
      if (module !== "./extension") {
        return Promise.reject(new Error("distlab-course has no module " + module));
      }
      return Promise.resolve(function () {
        return { __esModule: true, default: plugins };
      });
    }
  };
  window._JUPYTERLAB = window._JUPYTERLAB || {};
  window._JUPYTERLAB["distlab-course"] = container;
})();
