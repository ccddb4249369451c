// The navigation bar (templates/base.html): one menu per group, opened by its button, and on a
// narrow screen the whole bar folded behind the Menu button. Keyboard: Enter or Space opens a
// group, the arrow keys walk its links, Escape closes it and returns to its button.
(function () {
  "use strict";

  function setUp() {
    const topbar = document.querySelector(".topbar");
    const nav = topbar && topbar.querySelector(".nav");
    if (!nav) return;  // signed out: no bar
    const buttons = [...nav.querySelectorAll(".nav-group-button")];
    const toggle = topbar.querySelector(".menu-toggle");

    const menuOf = (button) => document.getElementById(button.getAttribute("aria-controls"));
    const linksOf = (button) => [...menuOf(button).querySelectorAll("a")];
    const isOpen = (button) => button.getAttribute("aria-expanded") === "true";

    function close(button, focus) {
      button.setAttribute("aria-expanded", "false");
      if (focus) button.focus();
    }

    function open(button) {
      buttons.forEach((other) => { if (other !== button) close(other, false); });
      button.setAttribute("aria-expanded", "true");
    }

    function openAt(button, index) {
      open(button);
      const links = linksOf(button);
      links[(index + links.length) % links.length].focus();
    }

    buttons.forEach((button) => {
      button.addEventListener("click", () => (isOpen(button) ? close(button, false) : open(button)));
      button.addEventListener("keydown", (event) => {
        if (event.key === "ArrowDown") { event.preventDefault(); openAt(button, 0); }
        if (event.key === "ArrowUp") { event.preventDefault(); openAt(button, -1); }
      });
      menuOf(button).addEventListener("keydown", (event) => {
        const links = linksOf(button);
        const here = links.indexOf(document.activeElement);
        const moves = { ArrowDown: here + 1, ArrowUp: here - 1, Home: 0, End: links.length - 1 };
        if (event.key in moves) {
          event.preventDefault();
          links[(moves[event.key] + links.length) % links.length].focus();
        }
      });
      // Tabbing out of a group closes it: one menu open at a time, never one left behind.
      button.parentElement.addEventListener("focusout", (event) => {
        if (!button.parentElement.contains(event.relatedTarget)) close(button, false);
      });
    });

    document.addEventListener("keydown", (event) => {
      if (event.key !== "Escape") return;
      const opened = buttons.find(isOpen);
      if (opened) { close(opened, true); return; }
      if (toggle && topbar.classList.contains("menu-open")) { fold(false); toggle.focus(); }
    });
    document.addEventListener("click", (event) => {
      if (!nav.contains(event.target)) buttons.filter(isOpen).forEach((b) => close(b, false));
    });

    function fold(unfolded) {
      topbar.classList.toggle("menu-open", unfolded);
      toggle.setAttribute("aria-expanded", String(unfolded));
    }
    if (toggle) toggle.addEventListener("click", () => fold(!topbar.classList.contains("menu-open")));
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUp);
  else setUp();
})();
