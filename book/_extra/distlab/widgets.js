/* The book's widgets, drawn from the state each page embeds: no kernel, no widget library.
 *
 * Every widget of this book is computed in advance while the page executes
 * (src/distlab/figures/widgets.py): rows of toggle buttons, each linked (jslink) to a Stack of
 * precomputed views (images or HTML). All a reader's click has to do is show another view.
 * This file draws exactly the models those widgets use (VBox, HBox, Stack, ToggleButtons,
 * HTML, Image, Link) from the page's application/vnd.jupyter.widget-state+json, in a few
 * kilobytes instead of the 3.6 MB of the full ipywidgets runtime. A widget of any other kind
 * shows a visible note instead of failing silently.
 */
(function () {
  "use strict";

  function start() {
    var stateScript = document.querySelector('script[type="application/vnd.jupyter.widget-state+json"]');
    if (!stateScript) { return; }
    var models = JSON.parse(stateScript.textContent).state;
    var listeners = {};  // "modelId.attribute" -> [function (value)]

    function model(reference) { return models[String(reference).replace(/^IPY_MODEL_/, "")]; }
    function idOf(reference) { return String(reference).replace(/^IPY_MODEL_/, ""); }
    function on(id, attribute, listener) {
      (listeners[id + "." + attribute] = listeners[id + "." + attribute] || []).push(listener);
    }
    function set(id, attribute, value) {
      var state = models[id].state;
      if (state[attribute] === value) { return; }  // also ends the echo of a two-way link
      state[attribute] = value;
      (listeners[id + "." + attribute] || []).forEach(function (listener) { listener(value); });
    }

    // Binary values (an Image's PNG) travel base64-encoded in "buffers".
    Object.keys(models).forEach(function (id) {
      (models[id].buffers || []).forEach(function (buffer) {
        models[id].state[buffer.path[0]] = buffer.data;
      });
    });

    // jslink: keep two attributes equal, in both directions.
    Object.keys(models).forEach(function (id) {
      var link = models[id];
      if (link.model_name !== "LinkModel") { return; }
      var source = link.state.source, target = link.state.target;
      on(idOf(source[0]), source[1], function (v) { set(idOf(target[0]), target[1], v); });
      on(idOf(target[0]), target[1], function (v) { set(idOf(source[0]), source[1], v); });
    });

    function element(tag, classes) {
      var node = document.createElement(tag);
      node.className = classes;
      return node;
    }

    var draw = {
      VBoxModel: function (id, state) { return box(state, "widget-box widget-vbox"); },
      HBoxModel: function (id, state) { return box(state, "widget-box widget-hbox"); },
      StackModel: function (id, state) {
        var node = element("div", "widget-box widget-stack");
        var views = state.children.map(function (child) { return node.appendChild(render(child)); });
        function show(index) {
          views.forEach(function (view, i) { view.style.display = i === index ? "" : "none"; });
        }
        show(state.selected_index);
        on(id, "selected_index", show);
        return node;
      },
      ToggleButtonsModel: function (id, state) {
        var node = element("div", "widget-inline-hbox widget-toggle-buttons");
        var label = node.appendChild(element("label", "widget-label"));
        label.textContent = state.description || "";
        var style = model(state.style) ? model(state.style).state : {};
        if (style.description_width) { label.style.width = style.description_width; }
        var group = node.appendChild(element("div", "widget-toggle-button-group"));
        var buttons = state._options_labels.map(function (text, i) {
          var button = group.appendChild(element("button", "widget-toggle-button"));
          button.type = "button";
          button.textContent = text;
          if (state.tooltips && state.tooltips[i]) { button.title = state.tooltips[i]; }
          if (style.button_width) { button.style.width = style.button_width; }
          button.addEventListener("click", function () { set(id, "index", i); });
          return button;
        });
        function mark(index) {
          buttons.forEach(function (button, i) {
            button.classList.toggle("mod-active", i === index);
            button.setAttribute("aria-pressed", String(i === index));
          });
        }
        mark(state.index);
        on(id, "index", mark);
        return node;
      },
      HTMLModel: function (id, state) {
        var node = element("div", "widget-inline-hbox widget-html");
        node.appendChild(element("div", "widget-html-content")).innerHTML = state.value;
        return node;
      },
      ImageModel: function (id, state) {
        var node = element("img", "widget-image");
        node.src = "data:image/" + state.format + ";base64," + state.value;
        node.alt = state.description || "";
        if (state.width) { node.width = state.width; }
        return node;
      }
    };

    function box(state, classes) {
      var node = element("div", classes);
      state.children.forEach(function (child) { node.appendChild(render(child)); });
      return node;
    }

    function render(reference) {
      var found = model(reference);
      if (found && draw[found.model_name]) {
        return draw[found.model_name](idOf(reference), found.state);
      }
      var note = element("div", "widget-unsupported");
      note.textContent = "[this widget (" + (found ? found.model_name : "unknown") + ") needs a live notebook]";
      return note;
    }

    document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').forEach(function (script) {
      var view = JSON.parse(script.textContent);
      if (!models[view.model_id]) { return; }
      var widget = script.parentNode.insertBefore(render(view.model_id), script);
      if (window.MathJax && window.MathJax.typesetPromise) {  // formulas in labels and HTML
        window.MathJax.typesetPromise([widget]).catch(function () {});
      }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
